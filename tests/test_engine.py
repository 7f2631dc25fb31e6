"""Several requests in flight: each gets exactly the output it would get
alone, cancellation frees its sequence, and nothing leaks."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.engine import Engine, EngineFullError
from speclm.errors import InvalidRequestError


def _toy_llm():
    return LLM(target=ToyBackend(6, seed=4, n_ctx=256), draft=ToyBackend(6, seed=8, order=1))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("spec", [SpecConfig(method="ar"), SpecConfig(method="sd-ngram", k=3),
                                  SpecConfig(method="sd-draft", k=2)])
def test_interleaved_requests_match_their_solo_outputs(spec, batched):
    llm = _toy_llm()
    prompts = [[i % 6, (i * 2) % 6, 1] for i in range(8)]
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=12 + i) for i in range(8)]
    solo = [llm.generate(p, sp, spec).token_ids for p, sp in zip(prompts, params)]
    engine = Engine(llm, max_concurrency=4, batched=batched)
    handles = [engine.submit(p, sp, spec) for p, sp in zip(prompts, params)]
    results = [h.result(timeout=30) for h in handles]
    engine.shutdown()
    assert [r.token_ids for r in results] == solo
    assert ["".join(h.stream()) for h in handles] == [r.text for r in results]
    assert llm.target.live_sequences == 0


def test_streamed_deltas_concatenate_to_the_text():
    llm = _toy_llm()
    engine = Engine(llm)
    h = engine.submit([0, 1], SamplingParams(max_new_tokens=20), SpecConfig(method="sd-ngram", k=2))
    assert "".join(h.stream()) == h.result().text
    engine.shutdown()


def test_cancel_before_admission_generates_nothing():
    llm = _toy_llm()
    engine = Engine(llm, start=False)
    h = engine.submit([0, 1], SamplingParams(max_new_tokens=50), SpecConfig(method="sd-draft", k=2))
    h.cancel()
    engine.start()
    res = h.result(timeout=10)
    assert res.finish_reason == "cancelled" and res.token_ids == []
    engine.shutdown()
    assert llm.target.live_sequences == 0 and llm.draft.live_sequences == 0


def test_cancel_mid_stream_frees_the_sequence(smollm):
    engine = Engine(smollm, max_concurrency=2)
    h = engine.submit("Once upon a time", SamplingParams(max_new_tokens=400, ignore_eos=True),
                      SpecConfig(method="sd-ngram", k=3))
    for _ in h.stream():
        h.cancel()
    res = h.result(timeout=30)
    assert res.finish_reason == "cancelled" and len(res.token_ids) < 400
    engine.shutdown()
    assert smollm.target.live_sequences == 0


def test_queue_limit_is_a_clear_error():
    llm = _toy_llm()
    engine = Engine(llm, max_concurrency=1, max_queue=2, start=False)
    queued = [engine.submit([0], SamplingParams(max_new_tokens=5)) for _ in range(3)]  # 1 slot + 2 queued
    with pytest.raises(EngineFullError, match="retry later"):
        engine.submit([0], SamplingParams(max_new_tokens=5))
    engine.start()
    assert all(len(h.result(timeout=10).token_ids) == 5 for h in queued)
    engine.shutdown()
    assert llm.target.live_sequences == 0


@pytest.mark.parametrize("batched", [True, False])
def test_a_failing_request_does_not_stop_the_others(monkeypatch, batched):
    llm = _toy_llm()
    engine = Engine(llm, max_concurrency=2, start=False, batched=batched)
    bad = engine.submit([0, 1], SamplingParams(max_new_tokens=5))
    good = engine.submit([1, 2], SamplingParams(max_new_tokens=5))
    original = bad_gen = engine._pending[0][1]
    monkeypatch.setattr(bad_gen, "plan", lambda *_, **__: (_ for _ in ()).throw(RuntimeError("boom")))
    engine.start()
    with pytest.raises(RuntimeError, match="boom"):
        bad.result(timeout=10)
    assert len(good.result(timeout=10).token_ids) == 5
    engine.shutdown()
    assert original.seq is None


def test_queue_counts_only_requests_waiting_beyond_free_slots():
    llm = _toy_llm()
    engine = Engine(llm, max_concurrency=4, max_queue=1, start=False)
    handles = [engine.submit([0], SamplingParams(max_new_tokens=3)) for _ in range(5)]  # 4 slots + 1 queued
    with pytest.raises(EngineFullError):
        engine.submit([0], SamplingParams(max_new_tokens=3))
    engine.start()
    assert all(len(h.result(timeout=10).token_ids) == 3 for h in handles)
    engine.shutdown()


def test_a_cancelled_queued_request_gives_back_its_place():
    llm = _toy_llm()
    engine = Engine(llm, max_concurrency=1, max_queue=1, start=False)
    running = engine.submit([0], SamplingParams(max_new_tokens=3))
    queued = engine.submit([1], SamplingParams(max_new_tokens=3))
    queued.cancel()
    engine.start()
    assert queued.result(timeout=10).finish_reason == "cancelled"
    later = engine.submit([2], SamplingParams(max_new_tokens=3))
    assert len(running.result(timeout=10).token_ids) == 3 and len(later.result(timeout=10).token_ids) == 3
    engine.shutdown()


def test_concurrency_beyond_the_kv_sequences_is_refused(smollm):
    with pytest.raises(InvalidRequestError, match="max_sequences"):
        Engine(smollm, max_concurrency=smollm.target.max_sequences + 1)


def test_asyncio_readers_follow_the_stream_without_threads():
    import asyncio

    llm = _toy_llm()
    engine = Engine(llm)
    handle = engine.submit([0, 1], SamplingParams(max_new_tokens=30), SpecConfig(method="sd-ngram", k=2))

    async def read_twice():
        async def collect():
            return "".join([t async for t in handle.astream()])
        texts = await asyncio.gather(collect(), collect())
        return texts, await handle.aresult()
    (a, b), result = asyncio.run(read_twice())
    assert a == b == result.text and len(result.token_ids) == 30
    engine.shutdown()


def test_freed_memory_goes_back_when_idle_and_every_few_requests(monkeypatch):
    import time

    import speclm.engine as engine_mod

    trims: list[int] = []
    monkeypatch.setattr(engine_mod, "return_freed_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(engine_mod, "TRIM_EVERY", 3)
    idle = Engine(_toy_llm())
    time.sleep(0.05)
    idle.shutdown()
    assert trims == []  # idle with nothing finished: nothing to give back
    engine = Engine(_toy_llm(), max_concurrency=1, start=False)
    handles = [engine.submit([i % 6], SamplingParams(max_new_tokens=4)) for i in range(7)]
    engine.start()
    for h in handles:
        h.result(timeout=10)
    deadline = time.monotonic() + 5
    while engine._untrimmed and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.shutdown()
    # one request at a time: a return after the 3rd and the 6th, and one once idle after the 7th
    assert len(trims) == 3 and engine._untrimmed == 0


def test_freed_memory_is_returned_where_the_c_library_is_glibc():
    import platform

    from speclm.machine import return_freed_memory

    assert return_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_buffers_a_step_frees_are_reused_by_the_next_not_faulted_in_again():
    import platform
    import resource

    from speclm.machine import reuse_freed_buffers

    if platform.libc_ver()[0] != "glibc" or not hasattr(resource, "RUSAGE_THREAD"):
        pytest.skip("glibc's mallopt and per-thread page-fault counts are Linux's")

    def step() -> None:  # a 16-row decode step's buffers: the logits rows, then a distribution per row
        rows = np.ones((16, 151_936), dtype=np.float32).copy()
        for row in rows:
            p = np.zeros(row.size)
            p[int(np.argmax(row))] = 1.0

    assert reuse_freed_buffers()
    step()
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(5):
        step()
    # glibc's adaptive thresholds fault in ~1,100 fresh pages a step here (the rows alone are 2,400 pages)
    assert (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / 5 < 100
