"""The SSD speculator stays in service: it never drafts past the context, one
request's failure is that request's alone, a lost speculator is replaced on
the next SSD request (bounded, with backoff), and sessions share its KV
sequences. Toy models where possible; SmolLM2-135M for the near-end case."""

from __future__ import annotations

import os
import signal
import time

import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.engine import Engine
from speclm.errors import BackendError
from speclm.speculative import steps
from speclm.speculative.proposers.draft_model import DraftModelProposer
from speclm.speculative.ssd.client import (SessionFailed, SpeculatorConfig, SpeculatorLost, SpeculatorProcess,
                                          SSDProposer)
from speclm.speculative.ssd.speculator import SpeculatorSession, SSDOptions
from speclm.speculative.ssd.supervisor import SpeculatorSupervisor
from speclm.speculative.ssd.wire import decode, encode
from speclm.speculative.ssd.launch import BY_HAND_MAX_SEQUENCES, worker_command, worker_config, worker_options
from speclm.speculative.ssd.worker import Worker, parser, toy_spec

from .ssd_inline import InlineChannel
from .test_server import wait_until

VOCAB = 6
PROMPT = [0, 1, 2, 0, 1]


class SlowToy(ToyBackend):
    """A toy target whose forwards take 10 ms, like a real verifier."""

    def score(self, seq, tokens):
        time.sleep(0.01)
        return super().score(seq, tokens)



def toy_llm(max_sequences: int = 2, **cfg) -> LLM:
    return LLM(target=SlowToy(VOCAB, seed=11, n_ctx=256), draft=ToyBackend(VOCAB, seed=11, n_ctx=256),
               max_sequences=max_sequences, speculator=SpeculatorConfig(threads=None, **cfg))


def gone(pid: int) -> bool:
    """The process no longer exists at all (exited and reaped: no zombie)."""
    return not os.path.exists(f"/proc/{pid}")



def sync_rounds(result) -> list[dict]:
    return [r.info for r in result.rounds if r.info and r.info.get("fallback") == "sync"]


# ---- the context end ---------------------------------------------------------------
def test_blocks_and_branches_stop_at_the_context_end():
    draft = ToyBackend(VOCAB, seed=3, n_ctx=12)
    session = SpeculatorSession(draft, list(range(5)) * 2, SamplingParams(), SSDOptions(fanout=6), k=4)
    assert len(session.start().tokens) == 2  # 10 tokens of context, 12 of room
    session.deadline = False
    while session.work():
        pass
    assert session.branches
    for b in session.branches.values():  # outcome (k, t) leaves 10 + k + 1 tokens: room for 1 - k more
        assert b.k == 0 and len(b.tokens) == 1 and len(draft.tokens(b.seq)) <= 12
    full = session.sync(list(range(6)) * 2)
    assert full.tokens == [] and full.info == {"context_end": True} and not session.work()
    session.close()
    assert draft.live_sequences == 0


def test_near_the_context_end_the_speculator_stays_in_service():
    """Eight sampled SSD requests fill a 64-token context; the speculator serves
    the next request (no round falls back to the synchronous path)."""
    with LLM(target="smollm2-135m", draft="smollm2-135m", n_ctx=64,
             speculator=SpeculatorConfig(threads=1)) as llm:
        prompt = llm.encode("Once upon a time")
        spec = SpecConfig(method="ssd", k=4)
        for i in range(8):
            out = llm.generate(prompt, SamplingParams(temperature=1.0, seed=i, ignore_eos=True,
                                                      max_new_tokens=64 - len(prompt)), spec)
            assert len(prompt) + len(out.token_ids) == 64, out.finish_reason
            assert not sync_rounds(out), sync_rounds(out)
        short = llm.generate(prompt, SamplingParams(max_new_tokens=8), spec)
        assert short.rounds and not sync_rounds(short)
        assert llm.speculator_state()["state"] == "alive" and llm.speculator_state()["restarts"] == 0


# ---- one session's failure -------------------------------------------------------
def test_a_failing_session_is_answered_not_fatal_to_the_worker():
    worker = Worker(ToyBackend(VOCAB, seed=3))
    start = {"op": "start", "params": {"temperature": 0.0}, "opts": {}, "k": 3, "context": PROMPT}
    for sid in ("a", "b"):
        header, _ = decode(worker.handle({**start, "sid": sid}))
        assert header["ok"]

    def boom():
        raise RuntimeError("draft exploded")

    worker.sessions["a"].work = boom
    while worker.work_once():
        pass
    failed, _ = decode(worker.handle({"op": "outcome", "sid": "a", "k": 0, "t": 1}))
    assert not failed["ok"] and "draft exploded" in failed["error"]
    other, _ = decode(worker.handle({"op": "outcome", "sid": "b", "k": 1, "t": 1}))
    assert other["ok"] and other["tokens"]
    for garbage in ([b"\xff not json"], [b"[1, 2]"], [encode({"op": "outcome", "sid": ["unhashable"]})[0]]):
        reply, stop = worker.answer(garbage)
        assert not decode(reply)[0]["ok"] and not stop


class FailingChannel(InlineChannel):
    """The speculator in process, failing this request's `fail_at`-th block."""

    fail_at = 2

    def __init__(self, backend, lost: list):
        super().__init__(backend)
        self.blocks, self.speculator = 0, self
        self.lost = lost

    def mark_lost(self, why):  # what a lost speculator would be told
        self.lost.append(why)

    def request(self, header):
        self.blocks += 1
        if self.blocks == self.fail_at:
            raise SessionFailed("speculator error: boom")
        return super().request(header)


def test_a_failed_block_moves_only_its_request_to_the_sync_path():
    target, draft, lost = ToyBackend(VOCAB, seed=11), ToyBackend(VOCAB, seed=99, order=1), []
    prop = SSDProposer(lambda: FailingChannel(draft, lost), SSDOptions(), k=3,
                       fallback=lambda: DraftModelProposer(draft))
    ssd = steps.generate(target, prop, PROMPT, SamplingParams(max_new_tokens=30), 3)
    prop.close()
    ar = steps.generate(target, None, PROMPT, SamplingParams(max_new_tokens=30), 0)
    assert ssd.token_ids == ar.token_ids and sync_rounds(ssd)
    assert lost == []  # the speculator itself was never declared lost


def test_an_error_reply_leaves_the_speculator_alive():
    llm = toy_llm()
    try:
        channel = llm.speculator().open()
        with pytest.raises(SessionFailed, match="no session"):
            channel.request({"op": "outcome", "k": 0, "t": 1})  # never started
        channel.close()
        out = llm.generate(PROMPT, SamplingParams(max_new_tokens=12), SpecConfig(method="ssd", k=2))
        assert not sync_rounds(out) and llm.speculator_state()["state"] == "alive"
    finally:
        llm.close()


# ---- a lost speculator ---------------------------------------------------------------
def test_kill_9_mid_request_then_the_next_request_gets_a_new_speculator():
    llm = toy_llm()
    try:
        params, spec = SamplingParams(max_new_tokens=40), SpecConfig(method="ssd", k=2)
        ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
        first = llm.speculator().pid
        emitted = []

        def kill_after_a_few(text):
            emitted.append(text)
            if len(emitted) == 6:
                os.kill(first, signal.SIGKILL)

        out = llm.generate(PROMPT, params, spec, on_text=kill_after_a_few)
        assert out.token_ids == ar.token_ids and sync_rounds(out)
        assert llm.speculator_state()["state"] == "lost"
        assert wait_until(lambda: gone(first), 10.0), "the killed speculator was not reaped"
        again = llm.generate(PROMPT, params, spec)
        assert again.token_ids == ar.token_ids and not sync_rounds(again)
        state = llm.speculator_state()
        assert state["state"] == "alive" and state["restarts"] == 1 and state["pid"] not in (None, first)
    finally:
        llm.close()


def test_a_speculator_marked_lost_is_stopped_and_reaped():
    proc = SpeculatorProcess(toy_spec(ToyBackend(VOCAB, seed=3)), SpeculatorConfig(threads=None))
    try:
        proc.mark_lost("no answer within 10 s")
        assert wait_until(lambda: gone(proc.pid), 6), "a lost speculator was left running or a zombie"
    finally:
        proc.close()


class FakeProcess:
    """A stand-in SpeculatorProcess: `die()` makes it lost."""

    started = 0

    def __init__(self, model, cfg):
        FakeProcess.started += 1
        self.pid, self.lost, self.lost_at, self.started_at = FakeProcess.started, None, None, time.monotonic()

    def check(self) -> bool:
        return self.lost is None

    def die(self) -> None:
        self.lost, self.lost_at = "killed", time.monotonic()

    def retire(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_restarts_back_off_and_give_up_while_speculators_keep_dying():
    FakeProcess.started = 0
    sup = SpeculatorSupervisor("m", SpeculatorConfig(max_restarts=2, restart_backoff_s=0.2), spawn=FakeProcess)
    sup.get().die()
    assert sup.get().pid == 2  # the first restart is immediate
    sup.get().die()
    assert sup.get().pid == 2 and sup.state()["state"] == "lost"  # a quick second death: back off
    assert wait_until(lambda: sup.get().pid == 3, 1.0)
    sup.get().die()
    time.sleep(0.5)
    assert sup.get().pid == 3  # a third failure in a row after two restarts: given up
    assert sup.state() == {"state": "lost", "restarts": 2, "pid": 3, "reason": "killed"}


def test_a_failed_restart_is_counted_and_retried_later():
    attempts = []

    def spawn(model, cfg):
        attempts.append(time.monotonic())
        if len(attempts) == 2:
            raise BackendError("cannot load the draft")
        return FakeProcess(model, cfg)

    sup = SpeculatorSupervisor("m", SpeculatorConfig(restart_backoff_s=0.2), spawn=spawn)
    sup.get().die()
    assert sup.get().lost == "killed" and len(attempts) == 2  # tried at once, failed: still the lost one
    assert sup.get().lost == "killed" and len(attempts) == 2  # backing off
    assert wait_until(lambda: sup.get().lost is None, 1.0) and sup.restarts == 1



def test_a_located_speculator_not_there_yet_is_waited_for_not_fatal():
    """A speculator found by SpeculatorConfig.locate (a Ray actor) may be restarting when a
    replica first needs it: requests then draft synchronously, and it is looked up again."""
    attempts = []

    def spawn(model, cfg):
        attempts.append(cfg.locate())
        if len(attempts) == 1:
            raise BackendError("no SSD speculator answered")
        return FakeProcess(model, cfg)

    sup = SpeculatorSupervisor("m", SpeculatorConfig(locate=lambda: "tcp://10.0.0.2:5555", restart_backoff_s=0.05),
                               spawn=spawn)
    assert sup.state()["state"] == "lost" and "no SSD speculator answered" in sup.state()["reason"]
    with pytest.raises(SpeculatorLost):
        sup.get().open()  # the request goes on synchronously
    assert wait_until(lambda: sup.get().lost is None, 1.0) and attempts == ["tcp://10.0.0.2:5555"] * 2


def test_without_locate_a_speculator_that_cannot_start_fails_the_first_request():
    def spawn(model, cfg):
        raise BackendError("cannot load the draft")

    with pytest.raises(BackendError, match="cannot load the draft"):
        SpeculatorSupervisor("m", SpeculatorConfig(), spawn=spawn)


def test_restart_backoff_is_capped():
    sup = SpeculatorSupervisor("m", SpeculatorConfig(restart_backoff_s=1.0, max_backoff_s=4.0, max_restarts=1 << 30),
                               spawn=FakeProcess)
    for _ in range(40):  # forty quick deaths in a row
        sup.get().die()
        sup._retry_at = 0.0  # skip the wait itself: the delay it chose is what is checked
    sup.get().die()
    sup.get()
    assert sup._retry_at - time.monotonic() <= 4.0


# ---- sessions share the speculator -------------------------------------------------
def test_one_session_never_takes_every_free_sequence():
    draft = ToyBackend(VOCAB, seed=3, max_sequences=8)  # 8 sequences for 2 sessions: 3 branches each
    sessions = [SpeculatorSession(draft, PROMPT, SamplingParams(), SSDOptions(fanout=8), k=3,
                                  live_sessions=lambda: 1, sessions=2)]
    sessions[0].start()
    sessions[0].deadline = False
    while sessions[0].work():
        pass
    assert len(sessions[0].branches) == 3
    sessions.append(SpeculatorSession(draft, PROMPT, SamplingParams(), SSDOptions(fanout=8), k=3,
                                      live_sessions=lambda: 2, sessions=2))  # still has a sequence
    sessions[1].start()
    for s in sessions:
        s.close()
    assert draft.live_sequences == 0


def test_the_speculator_is_sized_from_the_concurrency():
    cfg = SpeculatorConfig().sized(n_ctx=512, sessions=4)
    assert (cfg.sessions, cfg.max_sequences, cfg.n_ctx) == (4, 4 * (SSDOptions().fanout + 1), 512)
    assert SpeculatorConfig().sized(sessions=20).max_sequences == 64  # llama.cpp's limit
    assert SpeculatorConfig(max_sequences=10).sized(sessions=4).max_sequences == 10  # set explicitly: kept


def test_every_worker_setting_of_the_config_reaches_the_worker_process():
    """config -> the worker's command line -> the worker's parser -> the same settings, for
    every field declared as a worker flag (a new one fails the first check until it is
    given a value here that is not its default)."""
    names = [o.name for o in worker_options()]
    assert {"threads", "cores", "n_ctx", "max_sequences", "sessions", "kernels"} <= set(names)
    given = SpeculatorConfig(threads=3, cores=(1, 2), kernels="repack", n_ctx=512).sized(sessions=2)
    assert all(getattr(given, o.name) != o.default for o in worker_options()), "give every field a value"
    for cfg in (given, SpeculatorConfig(threads=None).sized(n_ctx=1024, sessions=5)):
        cmd = worker_command("m", cfg, "ipc:///tmp/x.sock")
        assert cmd[1:3] == ["-m", "speclm.speculative.ssd.worker"]
        args = parser().parse_args(cmd[3:])
        back = worker_config(args)
        assert {n: getattr(back, n) for n in names} == {n: getattr(cfg, n) for n in names}
        assert (args.bind, args.model, args.parent_pid) == ("ipc:///tmp/x.sock", "m", os.getpid())
    by_hand = worker_config(parser().parse_args(["--bind", "tcp://0.0.0.0:5555", "--model", "m"]))
    assert (by_hand.threads, by_hand.cores, by_hand.sessions, by_hand.kernels) == (None, None, None, None)
    assert (by_hand.n_ctx, by_hand.max_sequences) == (SpeculatorConfig().n_ctx, BY_HAND_MAX_SEQUENCES)


def test_four_concurrent_ssd_requests_leave_the_speculator_alive():
    llm = toy_llm(max_sequences=4)
    try:
        prompts = [[i % VOCAB, (i + 2) % VOCAB, 1, 3] for i in range(4)]
        params = SamplingParams(max_new_tokens=30)
        solo = [llm.generate(p, params, SpecConfig(method="ar")).token_ids for p in prompts]
        engine = Engine(llm, max_concurrency=4)
        handles = [engine.submit(p, params, SpecConfig(method="ssd", k=3)) for p in prompts]
        results = [h.result(timeout=60) for h in handles]
        engine.shutdown()
        assert [r.token_ids for r in results] == solo
        assert not any(sync_rounds(r) for r in results)
        assert llm.speculator_state() == {"state": "alive", "restarts": 0, "pid": llm.speculator().pid,
                                          "reason": None}
        assert wait_until(lambda: llm.speculator().stats()["sessions"] == 0, 10.0)
    finally:
        llm.close()


def test_start_timeout_message_is_unchanged_by_supervision():
    """The first start still fails loudly (the caller learns SSD cannot run)."""
    llm = LLM(target=ToyBackend(VOCAB, seed=11), draft=ToyBackend(VOCAB, seed=99),
              speculator=SpeculatorConfig(addr="tcp://127.0.0.1:9", start_timeout_s=0.5))
    try:
        with pytest.raises(BackendError, match="speclm speculator"):
            llm.generate(PROMPT, SamplingParams(max_new_tokens=4), SpecConfig(method="ssd"))
        assert llm.speculator_state() is None
    finally:
        llm.close()
