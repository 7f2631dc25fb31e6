"""Speculative speculative decoding (SSD) is lossless, and survives its speculator.

Statistics: as in test_lossless_sampling.py, the empirical distribution of the
first tokens is compared with the enumerated target distribution under the
sample-size bound of tests/stats.py, with a draft deliberately unlike the
target. The hit path pre-drafts every branch before each outcome (so the
second round's block comes from the speculation cache whenever the outcome
was predicted); the forced-miss path never pre-drafts (every block is a
fallback). Process tests run the real ZeroMQ worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.errors import BackendError, InvalidRequestError
from speclm.speculative import steps
from speclm.speculative.proposers.draft_model import DraftModelProposer
from speclm.speculative.ssd.client import SpeculatorConfig, SSDProposer
from speclm.speculative.ssd.fanout import allocate_fanout, candidates, outcome_probs, saguaro
from speclm.speculative.ssd.speculator import SSDOptions

from .ssd_inline import InlineChannel
from .stats import empirical_check, exact_distribution

VOCAB, N_TOKENS, N_SAMPLES, K = 4, 3, 8000, 2
PROMPT = [0, 1, 2, 0, 1]
P_MIN = 0.6  # the unlike draft's top-1 probability is 0.57 after token 1, 0.64-0.9 after the others


def make_target() -> ToyBackend:
    return ToyBackend(VOCAB, seed=11, order=2, sharpness=1.2)


def make_unlike_draft() -> ToyBackend:
    return ToyBackend(VOCAB, seed=99, order=1, sharpness=2.5)


def ssd_proposer(draft: ToyBackend, predraft: int | None, p_min: float = 0.0, k: int = K, **opts) -> SSDProposer:
    return SSDProposer(lambda: InlineChannel(draft, predraft), SSDOptions(**opts), k=k, p_min=p_min,
                       fallback=lambda: DraftModelProposer(draft, p_min=p_min))


# ---- fan-out and Saguaro arithmetic ---------------------------------------------
def test_outcome_probabilities_are_geometric_and_sum_to_one():
    p = outcome_probs(0.6, 3)
    assert np.allclose(p, [0.4, 0.24, 0.144, 0.216]) and p.sum() == pytest.approx(1.0)


def test_fanout_follows_the_likely_outcomes_and_respects_budget_and_caps():
    assert sum(allocate_fanout(0.9, 4, 12)) == 12
    high, low = allocate_fanout(0.95, 4, 12), allocate_fanout(0.1, 4, 12)
    assert high[-1] == max(high)  # high acceptance: the full-accept outcome gets most branches
    assert low[0] == max(low) and low[-1] <= 1  # low acceptance: k = 0 dominates
    flat, sharp = allocate_fanout(0.5, 3, 16, r=100.0), allocate_fanout(0.5, 3, 16, r=0.0)
    assert max(flat) - min(flat) <= 1 and sharp[0] > sharp[3]  # r -> inf spreads evenly
    assert allocate_fanout(0.5, 2, 10, caps=[1, 1, 1]) == [1, 1, 1]


def test_candidates_exclude_the_drafted_token():
    logits = np.array([0.1, 3.0, 2.0, 1.0])
    assert candidates(logits, 2) == [1, 2]
    assert candidates(logits, 2, exclude=1) == [2, 3]


def test_saguaro_scales_the_top_mass_and_stays_a_distribution():
    q = np.array([0.5, 0.3, 0.15, 0.05])
    assert saguaro(q, 1.0, 2) is q
    s = saguaro(q, 0.5, 2)
    assert s.sum() == pytest.approx(1.0) and s[0] < q[0] and s[3] > q[3]
    assert s[0] / s[1] == pytest.approx(q[0] / q[1])


# ---- losslessness ------------------------------------------------------------------
def _sample(predraft: int | None, temperature: float, c: float, p_min: float = 0.0) -> tuple[list, dict]:
    target, draft = make_target(), make_unlike_draft()
    samples, seen = [], {"hit": 0, "miss": 0, "accepted": 0, "rejected": 0}
    for _ in range(N_SAMPLES):
        prop = ssd_proposer(draft, predraft, p_min=p_min, fanout=4, saguaro_c=c)
        res = steps.generate(target, prop, PROMPT, SamplingParams(temperature=temperature,  # no seed: q matters
                                                                 max_new_tokens=K + 2), K)
        prop.close()
        samples.append(tuple(res.token_ids[:N_TOKENS]))
        for r in res.rounds[1:]:
            if r.info:  # rounds near the end may propose nothing
                seen["hit" if r.info["hit"] else "miss"] += 1
        seen["accepted"] += res.summary.accepted
        seen["rejected"] += sum(r.rejection_position is not None for r in res.rounds)
    return samples, seen


@pytest.mark.parametrize("c", [1.0, 0.5])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("path", ["hit", "forced-miss"])
def test_ssd_output_matches_the_target_distribution(path, temperature, c):
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(temperature=temperature), N_TOKENS)
    samples, seen = _sample(None if path == "hit" else 0, temperature, c)
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, f"TV {tv:.4f} exceeds the sample-size bound {bound:.4f} ({seen})"
    assert seen["accepted"] > N_SAMPLES // 20 and seen["rejected"] > N_SAMPLES // 20, seen
    if path == "hit":
        assert seen["hit"] > N_SAMPLES // 10, seen  # the cache really served blocks
    else:
        assert seen["hit"] == 0 and seen["miss"] > N_SAMPLES // 2, seen


@pytest.mark.parametrize("path", ["hit", "forced-miss"])
def test_ssd_cut_by_p_min_matches_the_target_distribution(path):
    """A confidence stop shortens blocks and pre-drafted branches; every token sent keeps its q."""
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(temperature=1.0), N_TOKENS)
    samples, seen = _sample(None if path == "hit" else 0, 1.0, 1.0, p_min=P_MIN)
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, f"TV {tv:.4f} exceeds the sample-size bound {bound:.4f} ({seen})"


def test_lower_saguaro_c_moves_the_residual_onto_the_cached_candidates():
    """Saguaro's trade, exactly: the speculator caches bonus tokens for a rejection among the
    draft's top tokens; scaling their mass down in q (which the verifier is given) moves the
    residual max(p − q, 0), from which a rejection resamples, onto them. (On the 4-token toy
    the end-to-end hit rate moves within sampling noise, 0.14–0.15 at c = 1 and 0.15 at
    c = 0.3 over 1,500 requests, so a statistical version of this test failed at random.)"""
    p = np.array([0.4, 0.3, 0.2, 0.1])  # the target
    q = np.array([0.5, 0.3, 0.15, 0.05])  # the draft: its top 2 are the cached candidates
    cached = candidates(np.log(q), 2)
    assert cached == [0, 1]

    def mass_on_cached(c: float) -> float:
        residual = np.maximum(p - saguaro(q, c, 2), 0.0)
        return residual[cached].sum() / residual.sum()

    assert mass_on_cached(1.0) == 0.0 and mass_on_cached(0.3) == pytest.approx(1.0)
    assert mass_on_cached(1.0) < mass_on_cached(0.8) < mass_on_cached(0.5)


@pytest.mark.parametrize("predraft,width", [(None, 1), (None, 3), (0, 1), (3, 1)])
def test_ssd_greedy_equals_plain_decoding_token_for_token(predraft, width):
    target = make_target()
    for draft in (make_unlike_draft(), make_target()):
        ar = steps.generate(target, None, PROMPT, SamplingParams(max_new_tokens=30), 0)
        prop = ssd_proposer(draft, predraft, fanout=3, width=width)
        ssd = steps.generate(target, prop, PROMPT, SamplingParams(max_new_tokens=30), K)
        prop.close()
        assert ssd.token_ids == ar.token_ids


def _rounds(prop: SSDProposer, params: SamplingParams, k: int):
    """steps.generate with `prop` (closed after), and per round (context, block, hit)."""
    seen, propose = [], prop.propose

    def recording(context, k, params, rng):
        draft = propose(context, k, params, rng)
        seen.append((list(context), list(draft.tokens), bool(prop.round_info().get("hit"))))
        return draft

    prop.propose = recording
    res = steps.generate(make_target(), prop, PROMPT, params, k)
    prop.close()
    return res, seen


@pytest.mark.parametrize("predraft", [None, 0])
def test_p_min_cuts_ssd_blocks_where_it_cuts_sd_drafts(predraft):
    """Greedy, every SSD block (a pre-drafted branch on the hit path, one drafted on
    the miss) is the block sd-draft drafts from the same context under the same p_min,
    so a p_min shortens SSD's blocks as it does sd-draft's, and the output is unchanged."""
    params, k = SamplingParams(max_new_tokens=40), 4
    ar = steps.generate(make_target(), None, PROMPT, params, 0)
    res, seen = _rounds(ssd_proposer(make_unlike_draft(), predraft, p_min=P_MIN, k=k, fanout=4), params, k)
    assert res.token_ids == ar.token_ids
    sd = DraftModelProposer(make_unlike_draft(), p_min=P_MIN)
    for context, block, _ in seen:
        assert block == sd.propose(context, k, params, np.random.default_rng()).tokens, context
    _, uncut = _rounds(ssd_proposer(make_unlike_draft(), predraft, k=k, fanout=4), params, k)
    mean = lambda rounds: np.mean([len(block) for _, block, _ in rounds])  # noqa: E731
    assert mean(seen) < mean(uncut) == k
    assert len({len(block) for _, block, _ in seen}) > 1  # cut by confidence, not to a shorter K
    if predraft is None:
        assert any(hit and len(block) < k for _, block, hit in seen), seen  # pre-drafted branches are cut too


def test_ssd_options_are_validated():
    with pytest.raises(InvalidRequestError, match="saguaro_c"):
        SSDOptions(saguaro_c=0.0)
    with pytest.raises(InvalidRequestError, match="fanout"):
        SSDOptions(fanout=-1)
    with pytest.raises(InvalidRequestError, match="fallback"):
        SSDOptions(fallback="maybe")
    with pytest.raises(InvalidRequestError, match="ssd-width"):
        SSDOptions(width=0)


# ---- the real speculator process ---------------------------------------------------
class SlowToy(ToyBackend):
    """A toy target whose block forward takes `delay` s, like a real verifier,
    so the speculator has time to pre-draft."""

    delay = 0.03

    def score(self, seq, tokens):
        time.sleep(self.delay)
        return super().score(seq, tokens)


def _process_llm(draft: ToyBackend, **cfg) -> LLM:
    return LLM(target=SlowToy(VOCAB, seed=11, order=2, sharpness=1.2), draft=draft,
               speculator=SpeculatorConfig(threads=None, timeout_s=cfg.pop("timeout_s", 5.0), **cfg))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_process_ssd_greedy_equals_plain_and_serves_hits_over_zeromq():
    llm = _process_llm(make_target())  # a draft equal to the target: outcomes are predictable
    try:
        params = SamplingParams(max_new_tokens=24)
        ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
        ssd = llm.generate(PROMPT, params, SpecConfig(method="ssd", k=3, ssd=SSDOptions(fanout=4)))
        assert ssd.token_ids == ar.token_ids
        assert ssd.summary.cache_hit_rate is not None and ssd.summary.cache_hit_rate > 0.5, \
            [r.info for r in ssd.rounds]
        cut = llm.generate(PROMPT, params, SpecConfig(method="ssd", k=3, p_min=0.9, ssd=SSDOptions(fanout=4)))
        assert cut.token_ids == ar.token_ids  # the speculator got the request's p_min: shorter blocks
        assert np.mean([r.proposed for r in cut.rounds]) < np.mean([r.proposed for r in ssd.rounds])
        pid = llm.speculator().pid
    finally:
        llm.close()
    assert not _alive(pid), "the speculator outlived LLM.close()"


def test_killing_the_speculator_mid_generation_still_gives_the_right_output(caplog):
    llm = _process_llm(make_unlike_draft())
    try:
        params = SamplingParams(max_new_tokens=40)
        ar = llm.generate(PROMPT, params, SpecConfig(method="ar"))
        pid = llm.speculator().pid
        emitted = []

        def kill_after_a_few(text):
            emitted.append(text)
            if len(emitted) == 6:
                os.kill(pid, signal.SIGKILL)

        with caplog.at_level("WARNING", logger="speclm.ssd"):
            ssd = llm.generate(PROMPT, params, SpecConfig(method="ssd", k=2, ssd=SSDOptions(fanout=4)),
                               on_text=kill_after_a_few)
        assert ssd.token_ids == ar.token_ids and ssd.finish_reason == "length"
        assert any(r.info and r.info.get("fallback") == "sync" for r in ssd.rounds)
        assert sum("speculator lost" in m for m in caplog.messages) == 1
        again = llm.generate(PROMPT, params, SpecConfig(method="ssd", k=2))  # served by a new speculator
        assert again.token_ids == ar.token_ids and llm.speculator().pid != pid
    finally:
        llm.close()


def test_an_unreachable_speculator_is_a_clear_error_not_a_hang():
    llm = LLM(target=make_target(), draft=make_unlike_draft(),
              speculator=SpeculatorConfig(addr="tcp://127.0.0.1:9", start_timeout_s=1.0))
    t0 = time.monotonic()
    try:
        with pytest.raises(BackendError, match="speclm speculator"):
            llm.generate(PROMPT, SamplingParams(max_new_tokens=4), SpecConfig(method="ssd"))
    finally:
        llm.close()
    assert time.monotonic() - t0 < 10


def test_no_orphan_speculator_when_the_verifier_is_killed(tmp_path):
    script = textwrap.dedent("""
        import os, sys
        from speclm import LLM, SamplingParams, SpecConfig
        from speclm.backends.toy import ToyBackend
        llm = LLM(target=ToyBackend(4, seed=11), draft=ToyBackend(4, seed=99))
        llm.generate([0, 1, 2], SamplingParams(max_new_tokens=4), SpecConfig(method="ssd", k=2))
        print(llm.speculator().pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the speculator survived its verifier"


# ---- real model -----------------------------------------------------------------------
def test_smollm2_ssd_greedy_equals_plain_decoding():
    with LLM(target="smollm2-135m", draft="smollm2-135m",
             speculator=SpeculatorConfig(threads=1)) as llm:
        ids = llm.encode("def fibonacci(n):\n")
        params = SamplingParams(max_new_tokens=40)
        ar = llm.generate(ids, params, SpecConfig(method="ar"))
        ssd = llm.generate(ids, params, SpecConfig(method="ssd", k=3, ssd=SSDOptions(fanout=4)))
        assert ssd.token_ids == ar.token_ids
        assert all(r.info is not None for r in ssd.rounds if r.proposed)


def test_a_verifier_given_the_unscaled_q_fails_the_same_check(monkeypatch):
    """The check has power on what SSD adds: drafting from Saguaro's q' but
    verifying against the draft's plain q is caught by the same bound."""
    from speclm.sampling import sample, target_probs
    from speclm.speculative.ssd import speculator as spec_mod

    def draw_from_q_prime_send_q(self, logits, position):
        q = target_probs(logits, self.params)
        return sample(saguaro(q, 0.2, 2), self.rng), q

    monkeypatch.setattr(spec_mod.SpeculatorSession, "_draw", draw_from_q_prime_send_q)
    exact = exact_distribution(make_target(), PROMPT, SamplingParams(temperature=1.0), N_TOKENS)
    samples, _ = _sample(0, 1.0, 0.2)
    tv, bound = empirical_check(samples, exact)
    assert tv > bound, f"wrong q not detected: TV {tv:.4f} <= bound {bound:.4f}"


def test_a_one_token_request_closes_its_speculator_session():
    """begin() asks for a block before the prefill; a request that never drafts
    (max_new_tokens=1) still closes its session, so the worker's KV is freed."""
    llm = _process_llm(make_unlike_draft())
    try:
        for _ in range(3):
            out = llm.generate(PROMPT, SamplingParams(max_new_tokens=1), SpecConfig(method="ssd", k=2))
            assert len(out.token_ids) == 1
        ssd = llm.generate(PROMPT, SamplingParams(max_new_tokens=12), SpecConfig(method="ssd", k=2))
        ar = llm.generate(PROMPT, SamplingParams(max_new_tokens=12), SpecConfig(method="ar"))
        assert ssd.token_ids == ar.token_ids and llm.speculator().lost is None
        assert llm.speculator().stats()["sessions"] == 0
        assert llm.speculator().stats()["live_sequences"] == 0
    finally:
        llm.close()
