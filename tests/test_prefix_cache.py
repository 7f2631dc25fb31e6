"""Prefix caching: a request whose prompt starts like an earlier one in the same
scope prefills only the rest, and emits what it would have emitted uncached."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.speculative.steps import plan_step, run_step
from speclm.engine import Engine
from speclm.errors import BackendError, InvalidRequestError
from speclm.prefix_cache import MIN_REUSE, PrefixCache

BASE = [0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 3, 5, 0, 1, 2, 3, 4, 5, 0, 2]  # 20 tokens


def _toy() -> ToyBackend:
    return ToyBackend(6, seed=5, order=2, sharpness=2.0)


def _run(llm: LLM, prompt: list[int], method: str = "ar", scope: str | None = None, **params):
    spec = SpecConfig(method=method, k=4, cache_scope=scope)
    return llm.generate(prompt, SamplingParams(max_new_tokens=12, **params), spec)


@pytest.mark.parametrize("method", ["ar", "sd-suffix"])
def test_a_prompt_sharing_an_earlier_start_prefills_only_the_rest_and_emits_the_same(method):
    cold, warm = LLM(target=_toy()), LLM(target=_toy(), prefix_cache_tokens=1000)
    second = BASE[:14] + [5, 5, 4, 3, 2, 1]
    for prompt in (BASE, second):
        cold_before, warm_before = cold.target.scored_tokens, warm.target.scored_tokens
        ref = _run(cold, prompt, method)
        out = _run(warm, prompt, method)
        assert out.token_ids == ref.token_ids
    assert out.cached_prompt_tokens == 14  # the shared start, restored instead of prefilled
    cold_rows = cold.target.scored_tokens - cold_before
    assert warm.target.scored_tokens - warm_before == cold_rows - 14
    stats = warm.prefix_cache_stats()[None]
    assert (stats["lookups"], stats["hits"], stats["reused_tokens"]) == (2, 1, 14)


def test_an_identical_prompt_is_restored_but_its_pending_token_which_the_first_round_scores():
    llm = LLM(target=_toy(), prefix_cache_tokens=1000)
    _run(llm, BASE)
    rows_before = llm.target.scored_tokens
    out = _run(llm, BASE)
    assert out.cached_prompt_tokens == len(BASE) - 1
    assert out.rounds[0].prompt_rows == 0 and out.summary.prefill_ms > 0  # the restore was its prefill
    assert llm.target.scored_tokens - rows_before == out.summary.rounds + out.summary.proposed  # no prompt row


def test_with_hidden_states_an_identical_prompt_still_prefills_its_last_row():
    """A proposer reading hidden states (Medusa) needs the prompt's own forward."""
    target = _toy()
    target.enable_hidden()
    llm = LLM(target=target, prefix_cache_tokens=1000)
    _run(llm, BASE)
    assert _run(llm, BASE).cached_prompt_tokens == len(BASE) - 2


def test_scopes_never_reuse_each_others_kv():
    llm = LLM(target=_toy(), prefix_cache_tokens=1000)
    _run(llm, BASE, scope="tenant-a")
    assert _run(llm, BASE, scope="tenant-b").cached_prompt_tokens == 0
    assert _run(llm, BASE, scope="tenant-a").cached_prompt_tokens > 0
    assert llm.clear_prefix_cache("tenant-a") == 1
    assert _run(llm, BASE, scope="tenant-a").cached_prompt_tokens == 0


def test_short_shared_starts_are_not_reused():
    llm = LLM(target=_toy(), prefix_cache_tokens=1000)
    _run(llm, BASE)
    other = BASE[:MIN_REUSE - 1] + [5] * 12
    assert _run(llm, other).cached_prompt_tokens == 0


def test_the_cache_stays_within_its_token_bound_over_many_requests():
    rng = np.random.default_rng(0)
    llm = LLM(target=_toy(), prefix_cache_tokens=300)
    for _ in range(200):
        _run(llm, [int(t) for t in rng.integers(0, 6, size=int(rng.integers(10, 40)))])
    stats = llm.prefix_cache_stats()[None]
    assert 0 < stats["tokens"] <= 300
    assert stats["evicted"] > 0


def test_sampled_outputs_with_the_cache_equal_uncached_ones_seed_for_seed():
    cold, warm = LLM(target=_toy()), LLM(target=_toy(), prefix_cache_tokens=1000)
    for llm in (cold, warm):  # the same history, so the suffix drafter proposes alike
        _run(llm, BASE, "sd-suffix", temperature=0.9, top_p=0.9, seed=1)
    for seed in range(5):
        prompt = BASE[:16] + [seed % 6, 3]
        ref = _run(cold, prompt, "sd-suffix", temperature=0.9, top_p=0.9, seed=seed)
        out = _run(warm, prompt, "sd-suffix", temperature=0.9, top_p=0.9, seed=seed)
        assert out.cached_prompt_tokens >= 16 and out.token_ids == ref.token_ids


def test_batched_engine_requests_reuse_the_cache_and_emit_what_they_would_alone():
    cold, warm = LLM(target=_toy(), max_sequences=4), LLM(target=_toy(), max_sequences=4,
                                                          prefix_cache_tokens=1000)
    for llm in (cold, warm):
        _run(llm, BASE, "sd-suffix")
    prompts = [BASE[:12 + i] + [i % 6, 5, 4] for i in range(4)]
    ref = [_run(cold, p, "sd-suffix").token_ids for p in prompts]
    engine = Engine(warm, max_concurrency=4)
    try:
        handles = [engine.submit(p, SamplingParams(max_new_tokens=12), SpecConfig("sd-suffix", k=4))
                   for p in prompts]
        results = [h.result(timeout=60) for h in handles]
    finally:
        engine.shutdown()
    assert [r.token_ids for r in results] == ref
    assert all(r.cached_prompt_tokens >= 12 for r in results)


def _together(llm: LLM, prompts: list[list[int]], scopes=None, method: str = "ar") -> list:
    """Submit every prompt before the engine's first step, so they arrive as one wave."""
    engine = Engine(llm, max_concurrency=len(prompts), start=False)
    try:
        handles = [engine.submit(p, SamplingParams(max_new_tokens=12), SpecConfig(method, k=4, cache_scope=s))
                   for p, s in zip(prompts, scopes or [None] * len(prompts))]
        engine.start()
        return [h.result(timeout=60) for h in handles]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("method", ["ar", "sd-suffix"])
def test_a_wave_sharing_a_start_prefills_it_once_and_emits_what_each_would_alone(method):
    prompts = [BASE + [i % 6, 5, 4 - i, 3] for i in range(4)]  # one 20-token "system prompt", four questions
    ref = [_run(LLM(target=_toy()), p, method).token_ids for p in prompts]
    cold = LLM(target=_toy(), max_sequences=4)
    llm = LLM(target=_toy(), max_sequences=4, prefix_cache_tokens=1000)
    _together(cold, prompts, method=method)
    results = _together(llm, prompts, method=method)
    assert [r.token_ids for r in results] == ref
    assert [r.cached_prompt_tokens for r in results] == [0, 20, 20, 20]  # the first prefilled it; its KV was lent
    if method == "ar":  # one row a token after the prompt, so the rows differ by the prompt rows shared
        assert cold.target.scored_tokens - llm.target.scored_tokens == 3 * 20
    stats = llm.prefix_cache_stats()[None]
    assert (stats["hits"], stats["live_hits"], stats["reused_tokens"]) == (3, 3, 60)


def test_a_running_request_never_lends_its_kv_to_another_scope():
    prompts = [BASE + [1, 2], BASE + [3, 4], BASE + [5, 0]]
    llm = LLM(target=_toy(), max_sequences=3, prefix_cache_tokens=1000)
    results = _together(llm, prompts, scopes=["tenant-a", "tenant-b", "tenant-a"])
    assert [r.cached_prompt_tokens for r in results] == [0, 0, 20]
    assert llm.prefix_cache_stats()["tenant-b"]["live_hits"] == 0


def test_without_the_prefix_cache_a_wave_prefills_every_prompt_whole():
    prompts = [BASE + [i, 5] for i in range(3)]
    results = _together(LLM(target=_toy(), max_sequences=3), prompts)
    assert [r.cached_prompt_tokens for r in results] == [0, 0, 0]


def test_a_request_waiting_for_a_shared_start_waits_one_step_and_can_be_cancelled_meanwhile():
    llm = LLM(target=_toy(), max_sequences=3, prefix_cache_tokens=1000)
    gens = [llm.start(BASE + [i, 5], SamplingParams(max_new_tokens=4), SpecConfig("ar")) for i in range(3)]
    run_step(llm.target, plan_step(gens, llm.target.n_ctx))
    assert [g.seq is not None for g in gens] == [True, False, False]  # the first prefilled the start alone
    gens[2].close()  # cancelled while it waited: nothing to free, its result says so
    assert gens[2].result().finish_reason == "cancelled"
    run_step(llm.target, plan_step(gens[:2], llm.target.n_ctx))
    assert gens[1].cached_tokens == 20 and llm.target.live_sequences == 2


class _Unrestorable(ToyBackend):
    def load_sequence(self, seq, state, tokens):
        raise BackendError("llama.cpp could not restore a KV copy")


def test_a_copy_that_will_not_restore_is_dropped_and_the_prompt_prefilled_whole():
    ref = _run(LLM(target=_toy()), BASE)
    llm = LLM(target=_Unrestorable(6, seed=5, order=2, sharpness=2.0), prefix_cache_tokens=1000)
    _run(llm, BASE)
    out = _run(llm, BASE)
    assert out.cached_prompt_tokens == 0 and out.token_ids == ref.token_ids
    stats = llm.prefix_cache_stats()[None]
    assert stats["failed"] == 1 and stats["hits"] == 0 and stats["entries"] == 1  # the bad copy went, ours came


@pytest.mark.parametrize("size", [-1, True, 1.5, 10**9])
def test_bad_cache_sizes_are_refused_with_the_flag_named(size):
    with pytest.raises(InvalidRequestError, match="prefix-cache-tokens"):
        PrefixCache(size)


def test_real_model_kv_copy_is_bit_identical_and_greedy_output_unchanged(smollm):
    """On SmolLM2 (whose forwards of any block size agree bit for bit) a cached
    prefix changes nothing: the restored KV scores like the original."""
    target = smollm.target
    ids = target.tokenize("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    seq = target.new_sequence()
    try:
        target.prefill(seq, ids[:-4])
        ref = target.score(seq, ids[-4:])
        state, nbytes = target.save_sequence(seq)
        copy = target.new_sequence()
        try:
            target.load_sequence(copy, state, target.tokens(seq))
            target.rollback(copy, len(ids) - 4)
            assert nbytes > 0 and np.array_equal(target.score(copy, ids[-4:]), ref)
        finally:
            target.free(copy)
    finally:
        target.free(seq)
    warm = LLM(target=target, prefix_cache_tokens=10_000)
    first = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):"
    second = "def add(a, b):\n    return a + b\n\n\ndef div(a, b):"
    warm.generate(first, SamplingParams(max_new_tokens=8), SpecConfig("ar"))
    out = warm.generate(second, SamplingParams(max_new_tokens=16), SpecConfig("sd-suffix", k=4))
    ref = smollm.generate(second, SamplingParams(max_new_tokens=16), SpecConfig("ar"))
    assert out.cached_prompt_tokens > 0 and out.token_ids == ref.token_ids


def test_real_model_wave_with_one_system_prompt_shares_its_kv_and_keeps_greedy_output(smollm):
    """Three chats with one system prompt arrive together: the later two take its KV
    from the first while it runs, and emit what they emit alone (SmolLM2's forwards
    agree bit for bit across block sizes, so batch numerics do not enter here)."""
    system = "You are a careful assistant who answers questions about Python in one short sentence."
    questions = ["What does len() return?", "What is a tuple?", "How do I reverse a list?"]
    prompts = [smollm.target.tokenize_chat([{"role": "system", "content": system}, {"role": "user", "content": q}])
               for q in questions]
    ref = [smollm.generate(p, SamplingParams(max_new_tokens=12), SpecConfig("ar")).token_ids for p in prompts]
    llm = LLM(target=smollm.target, max_sequences=4, prefix_cache_tokens=10_000)
    results = _together(llm, prompts)
    assert [r.token_ids for r in results] == ref
    assert results[0].cached_prompt_tokens == 0 and min(r.cached_prompt_tokens for r in results[1:]) >= 20
    assert llm.prefix_cache_stats()[None]["live_hits"] == 2
