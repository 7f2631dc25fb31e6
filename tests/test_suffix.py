"""Suffix decoding (method sd-suffix): a model-free proposer that copies what
followed the context's longest matching suffix, in the request itself or in a
shared, bounded cache of earlier requests, and learns online. Its drafts never
change the output: greedy output equals plain decoding token for token, and
sampled output has the target's distribution."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from speclm.backends.toy import ToyBackend
from speclm.errors import InvalidRequestError
from speclm.sampling import SamplingParams
from speclm.speculative import steps
from speclm.costs import CostModel
from speclm.speculative.controller import Calibration, GoodputController
from speclm.speculative.proposers.suffix import SuffixProposer
from speclm.speculative.proposers.suffix_index import LEVELS, SuffixCache, SuffixConfig

from .stats import empirical_check, exact_distribution

GREEDY = SamplingParams()


def propose(proposer: SuffixProposer, context: list[int], k: int = 8) -> list[int]:
    return proposer.propose(context, k, GREEDY, np.random.default_rng(0)).tokens


def finished_request(cache: SuffixCache, tokens: list[int]) -> None:
    """A request that saw `tokens` and closed: it is committed to the cache."""
    p = SuffixProposer(cache)
    p.begin(tokens, GREEDY)
    p.close()


# ---- drafting from the request's own context --------------------------------
def test_copies_the_continuation_of_a_repeated_passage():
    p = SuffixProposer()
    ctx = [10, 11, 12, 13, 14, 15, 16, 17, 50, 51, 10, 11, 12, 13]
    assert propose(p, ctx, k=3) == [14, 15, 16]
    assert p.round_info()["source"] == "own" and p.round_info()["match"] == 4


def test_every_drafted_token_carries_its_estimated_acceptance():
    """Confidence = count(next token) / count(occurrences with a next token):
    after [1, 2], 3 followed twice and 4 once."""
    p = SuffixProposer(config=SuffixConfig(spec_offset=4))
    d = p.propose([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2], 3, GREEDY, np.random.default_rng(0))
    assert d.tokens[0] == 3
    assert d.confidence[0] == pytest.approx(2 / 3)
    assert d.q == [None] * len(d)  # deterministic: one-hot q, the acceptance rule is unchanged


def test_keeps_copying_a_repeat_that_runs_up_to_the_end_of_the_context():
    p = SuffixProposer()
    assert propose(p, [7, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1], k=6) == [2, 3, 1, 2, 3, 1]


def test_draft_length_grows_with_the_match_length():
    """At most floor(spec_factor * match) + spec_offset tokens."""
    ctx = [5, 6, 7, 8, 9, 20, 21, 22, 23, 24, 25, 26, 30, 5, 6, 7, 8, 9]  # match 5 at the end
    assert len(propose(SuffixProposer(config=SuffixConfig(spec_factor=1.0)), ctx, k=16)) == 5
    assert len(propose(SuffixProposer(config=SuffixConfig(spec_factor=0.5)), ctx, k=16)) == 2
    assert propose(SuffixProposer(config=SuffixConfig(spec_factor=2.0)), ctx, k=16) == \
        [20, 21, 22, 23, 24, 25, 26, 30, 5, 6]
    assert len(propose(SuffixProposer(config=SuffixConfig(spec_factor=2.0)), ctx, k=3)) == 3
    assert propose(SuffixProposer(config=SuffixConfig(min_match=6)), ctx) == []


def test_learns_the_growing_context_between_rounds():
    p = SuffixProposer()
    ctx = [1, 2, 3, 4]
    assert propose(p, ctx) == []
    ctx += [9, 8, 7, 1, 2]  # the output so far repeats the start
    assert propose(p, ctx, k=2) == [3, 4]


# ---- the shared cache ---------------------------------------------------------
def test_learns_across_requests_through_the_shared_cache():
    cache = SuffixCache(max_tokens=1000)
    first = [40, 41, 42, 43, 44, 45, 46, 47]
    assert propose(SuffixProposer(cache), [1, 2, 40, 41, 42]) == []  # nothing learnt yet
    finished_request(cache, first)
    second = SuffixProposer(cache)
    assert propose(second, [1, 2, 40, 41, 42], k=3) == [43, 44, 45]
    assert second.round_info()["source"] == "cache"
    assert cache.stats()["cached_requests"] == 1 and cache.stats()["hits"] == 1


def test_prefers_the_requests_own_context():
    """The same suffix continues differently in the cache (even many times
    over) and in the request: the request's own continuation is drafted."""
    cache = SuffixCache(max_tokens=1000)
    for _ in range(5):
        finished_request(cache, [1, 2, 3, 9, 9, 9])
    p = SuffixProposer(cache)
    assert propose(p, [1, 2, 3, 4, 5, 6, 0, 1, 2, 3], k=3) == [4, 5, 6]
    assert p.round_info()["source"] == "own"


def test_a_longer_match_in_the_cache_beats_a_short_one_in_the_request():
    cache = SuffixCache(max_tokens=1000)
    finished_request(cache, [20, 21, 22, 23, 24, 25, 26, 27])
    p = SuffixProposer(cache)
    assert propose(p, [24, 0, 20, 21, 22, 23, 24], k=3) == [25, 26, 27]
    assert p.round_info()["source"] == "cache"


def test_an_answers_first_draft_is_calibrated_apart_from_the_later_ones():
    """The first draft continues the prompt's end (in chat, the template's assistant
    header, the same for every request), so its calibration cells are its own:
    what that header was followed by elsewhere says little about this answer."""
    cache = SuffixCache(max_tokens=1000)
    finished_request(cache, [7, 8, 9, 1, 2, 3, 4, 5])
    ctrl = GoodputController(CostModel(verify_ms={b: 1.0 + 0.1 * b for b in range(1, 10)}), k_max=8,
                             per_position=True)
    p = SuffixProposer(cache)
    prompt = [6, 7, 8, 9]
    p.begin(prompt, GREEDY)
    for context in (prompt, prompt + [1, 2]):
        ctrl.choose(8)
        ctrl.keep(p.propose(context, 8, GREEDY, np.random.default_rng(0)), len(context))
        assert p.round_info()["source"] == "cache"
    ctrl.learn(prompt + [1, 2, 3, 4, 5])
    sources = {group[0] for group, _bucket in ctrl.calibration.cells}
    assert sources == {"cache-first", "cache"}


def test_generation_commits_its_prompt_and_output_to_the_cache_at_close():
    """Online learning end to end: a repeated request drafts its whole answer
    from the first one's output, with the same greedy result in fewer rounds."""
    target = ToyBackend(20, seed=5, order=3, sharpness=3.0)
    cache = SuffixCache(max_tokens=10_000)
    params = SamplingParams(max_new_tokens=30)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    first = steps.generate(target, SuffixProposer(cache), prompt, params, 8)
    again = steps.generate(target, SuffixProposer(cache), prompt, params, 8)
    assert again.token_ids == first.token_ids
    assert cache.stats()["cached_requests"] == 2
    assert len(again.rounds) <= len(first.rounds) / 2
    assert any(r.info and r.info["source"] == "cache" for r in again.rounds)


def test_update_lets_the_final_rounds_tokens_reach_the_cache():
    cache = SuffixCache(max_tokens=100)
    p = SuffixProposer(cache)
    propose(p, [1, 2, 3])
    p.update([1, 2, 3, 4, 5])  # the last round's output, seen after the last propose()
    p.close()
    p.close()  # idempotent: committed once
    assert cache.stats()["cached_tokens"] == 5 and cache.stats()["cached_requests"] == 1


def test_the_cache_stays_within_its_bound_after_1000_requests():
    rng = np.random.default_rng(0)
    cache = SuffixCache(max_tokens=5000)
    for _ in range(1000):
        cache.add(rng.integers(0, 50, int(rng.integers(1, 400))).tolist())
        assert cache.stats()["cached_tokens"] <= 5000
    stats = cache.stats()
    assert stats["added_requests"] == 1000 and stats["evicted_requests"] == 1000 - stats["cached_requests"]
    index = cache._index
    assert len(index.tokens) == stats["cached_tokens"] + stats["cached_requests"]  # tokens + separators
    entries = [occ for m in index.maps for v in m.values() for occ in ([v] if isinstance(v, int) else v)]
    assert len(entries) <= len(LEVELS) * 5000
    assert min(entries) >= index.base  # nothing evicted is still indexed


def test_the_oldest_requests_are_evicted_first():
    cache = SuffixCache(max_tokens=12)
    for start in (100, 200, 300):
        finished_request(cache, list(range(start, start + 5)))
    assert cache.stats()["cached_requests"] == 2  # 15 tokens do not fit in 12
    assert propose(SuffixProposer(cache), [0, 100, 101]) == []
    assert propose(SuffixProposer(cache), [0, 200, 201], k=2) == [202, 203]


def test_a_request_longer_than_the_cache_keeps_its_last_tokens():
    cache = SuffixCache(max_tokens=10)
    cache.add(list(range(100, 130)))
    assert cache.stats()["cached_tokens"] == 10
    assert propose(SuffixProposer(cache), [0, 122, 123], k=2) == [124, 125]


def test_size_zero_disables_the_cache_and_clear_empties_it():
    off = SuffixCache(max_tokens=0)
    finished_request(off, [1, 2, 3, 4])
    assert off.stats()["cached_tokens"] == 0 and propose(SuffixProposer(off), [9, 1, 2]) == []
    cache = SuffixCache(max_tokens=100)
    finished_request(cache, [1, 2, 3, 4])
    cache.clear()
    assert cache.stats()["cached_tokens"] == 0 and propose(SuffixProposer(cache), [9, 1, 2]) == []


def test_concurrent_requests_share_the_cache_safely():
    cache = SuffixCache(max_tokens=2000)
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(50):
                p = SuffixProposer(cache)
                ctx = rng.integers(0, 20, 60).tolist()
                for n in range(10, 60, 7):
                    propose(p, ctx[:n])
                p.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.stats()["cached_tokens"] <= 2000 and cache.stats()["lookups"] > 0


@pytest.mark.parametrize("make", [
    lambda: SuffixCache(max_tokens=-1),
    lambda: SuffixCache(max_tokens=10**12),
    lambda: SuffixCache(max_tokens=1.5),
    lambda: SuffixCache(max_tokens=True),
])
def test_bad_cache_sizes_are_rejected(make):
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        make()


@pytest.mark.parametrize("kwargs,setting", [
    (dict(max_depth=0), "max_depth"), (dict(max_depth=1000), "max_depth"),
    (dict(min_match=0), "min_match"), (dict(max_depth=4, min_match=5), "min_match"),
    (dict(spec_factor=0), "spec_factor"), (dict(spec_factor=-1.0), "spec_factor"),
    (dict(spec_factor=1e9), "spec_factor"), (dict(spec_offset=-1), "spec_offset"),
    (dict(min_prob=1.5), "min_prob"), (dict(max_candidates=0), "max_candidates"),
    (dict(rematch="yes"), "rematch"), (dict(max_segments=0), "max_segments"),
])
def test_bad_proposer_settings_are_rejected_naming_the_setting(kwargs, setting):
    with pytest.raises(InvalidRequestError, match=setting):
        SuffixConfig(**kwargs)


# ---- the output is the target's ----------------------------------------------
def _warm_cache(vocab: int, max_tokens: int, seed: int = 99) -> SuffixCache:
    """A cache filled with other requests: greedy text of a deliberately unlike model."""
    other = ToyBackend(vocab, seed=seed, order=1, sharpness=2.5)
    cache = SuffixCache(max_tokens=max_tokens)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        ctx = rng.integers(0, vocab, 3).tolist()
        for _ in range(30):
            ctx.append(int(np.argmax(other.logits_for(ctx))))
        cache.add(ctx)
    return cache


REMATCH = SuffixConfig(rematch=True)


@pytest.mark.parametrize("with_controller,config", [(False, None), (True, None), (False, REMATCH), (True, REMATCH)])
def test_greedy_output_equals_plain_decoding_token_for_token(with_controller, config):
    target = ToyBackend(6, seed=3, order=2, sharpness=2.0)
    cache = _warm_cache(6, 2000)
    params, spanned = SamplingParams(max_new_tokens=60), 0
    for prompt in ([0, 1, 2, 3], [5, 5, 4, 0, 1, 5, 5], [2]):
        ar = steps.generate(target, None, prompt, params, 0)
        ctrl = GoodputController(CostModel(verify_ms={b: 1.0 + 0.1 * b for b in range(1, 10)}), k_max=8,
                                 per_position=True) if with_controller else None
        out = steps.generate(target, SuffixProposer(cache, config), prompt, params, 8, controller=ctrl)
        assert out.token_ids == ar.token_ids
        assert out.summary.proposed > 0
        spanned += sum(bool(r.info and r.info.get("segments")) for r in out.rounds)
    assert (spanned > 0) == (config is REMATCH)


VOCAB, N_TOKENS, N_SAMPLES, K = 4, 3, 8000, 3
PROMPT = [0, 1, 2, 0, 1]


@pytest.mark.parametrize("with_controller,config", [(False, None), (True, None), (True, REMATCH)])
def test_sampled_output_has_the_target_distribution(with_controller, config):
    """Temperature 1, top-p 0.8, drafts from a cache of an unlike model's text
    that keeps learning from every sample (and, with the controller, blocks
    cut by calibrated estimates; with rematch, drafts that go on from a new
    match): the first tokens' empirical distribution is the exact target
    distribution within the sample-size bound."""
    target = ToyBackend(VOCAB, seed=11, order=2, sharpness=1.2)
    params_kw = dict(temperature=1.0, top_p=0.8)
    exact = exact_distribution(target, PROMPT, SamplingParams(**params_kw), N_TOKENS)
    cache = _warm_cache(VOCAB, max_tokens=3000)
    # fixed costs under which some prefixes pay and some do not (weight 0: not re-measured)
    cost, calibration = CostModel(verify_ms={1: 1.0, 2: 1.5, 3: 2.0, 4: 2.5}, weight=0.0), Calibration()
    samples, accepted, rejected, cut_to_zero, spanned = [], 0, 0, 0, 0
    for _ in range(N_SAMPLES):
        params = SamplingParams(max_new_tokens=K + 2, **params_kw)  # unseeded: accepted with probability p(d)
        ctrl = GoodputController(cost, k_max=K, calibration=calibration, per_position=True) if with_controller else None
        res = steps.generate(target, SuffixProposer(cache, config), PROMPT, params, K, controller=ctrl)
        samples.append(tuple(res.token_ids[:N_TOKENS]))
        accepted += res.summary.accepted
        rejected += sum(r.rejection_position is not None for r in res.rounds)
        cut_to_zero += sum(bool(r.info and r.info["drafted"] and not r.info["kept"]) for r in res.rounds)
        spanned += sum(bool(r.info and r.info.get("segments")) for r in res.rounds)
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, f"TV {tv:.4f} exceeds the sample-size bound {bound:.4f}"
    assert accepted > N_SAMPLES // 20 and rejected > N_SAMPLES // 20, (accepted, rejected)
    assert (cut_to_zero > N_SAMPLES // 20) == with_controller, cut_to_zero  # the controller really cut
    assert (spanned > N_SAMPLES // 20) == (config is REMATCH), spanned  # drafts really went on from new matches
    if with_controller:  # the proposer named each draft's source: cache drafts were calibrated apart
        assert "cache" in {group[0] for group, _ in calibration.cells if isinstance(group, tuple)}
