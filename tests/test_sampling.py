"""The processed distribution: temperature, top-k, top-p, min-p, against
brute-force reference definitions; seeded runs are reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from speclm.backends.toy import ToyBackend
from speclm.sampling import SamplingParams, sample, target_probs
from speclm.speculative import steps
from speclm.speculative.proposers.ngram import NgramProposer, find_continuation


def reference(logits, t, top_k=0, top_p=1.0, min_p=0.0):
    p = np.exp((logits - logits.max()) / t)
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    keep = set(order[:top_k] if top_k else order)
    if top_p < 1.0:  # the nucleus of the distribution renormalised after top-k (as HF and vLLM do)
        mass = sum(p[i] for i in keep)
        acc, nucleus = 0.0, []
        for i in (i for i in order if i in keep):
            nucleus.append(i)
            acc += p[i] / mass
            if acc >= top_p - 1e-12:
                break
        keep &= set(nucleus)
    if min_p > 0:
        keep &= {i for i in range(len(p)) if p[i] >= min_p * p.max()}
    q = np.array([p[i] if i in keep else 0.0 for i in range(len(p))])
    return q / q.sum()


@pytest.mark.parametrize("kw", [dict(), dict(top_k=3), dict(top_p=0.7), dict(min_p=0.1),
                                dict(top_k=5, top_p=0.9, min_p=0.05)])
@pytest.mark.parametrize("t", [0.3, 1.0, 2.0])
def test_processed_distribution_matches_reference(kw, t):
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.standard_normal(50).astype(np.float32) * 3
        got = target_probs(logits, SamplingParams(temperature=t, **kw))
        np.testing.assert_allclose(got, reference(logits.astype(np.float64), t, **kw), atol=1e-12)


def test_top_p_beyond_the_probe_window_falls_back_to_a_full_sort():
    logits = np.zeros(5000, dtype=np.float32)  # flat: the nucleus needs 4500 tokens
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.9))
    assert np.count_nonzero(p) == 4500


def test_greedy_is_one_hot_at_the_first_argmax():
    p = target_probs(np.array([1.0, 3.0, 3.0, 0.0]), SamplingParams())
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_sample_never_draws_zero_probability_tokens():
    rng = np.random.default_rng(1)
    p = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {sample(p, rng) for _ in range(2000)} == {1, 3}


def test_a_seed_makes_a_sampled_run_reproducible():
    target = ToyBackend(6, seed=2)
    params = SamplingParams(temperature=1.0, seed=1234, max_new_tokens=30)
    runs = [steps.generate(target, NgramProposer(1, 3), [0, 1, 2], params, 4).token_ids for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_ngram_lookup_copies_the_latest_longest_match():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert find_continuation(ctx, 3, 1, 3) == [7, 8, 1]  # latest occurrence of [1,2,3]
    assert find_continuation([5, 6, 7], 3, 1, 3) == []
    assert find_continuation([4, 1, 2, 4], 2, 1, 3) == [1, 2]  # falls back to n = 1


def _reference_order(p: np.ndarray) -> np.ndarray:
    return np.lexsort((np.arange(p.size), -p))  # most likely first, lower ids first among ties


@pytest.mark.parametrize("seed", range(6))
def test_top_k_and_top_p_keep_the_most_likely_lower_ids_first_among_ties(seed):
    """The filters against a full sort of the vocabulary, on rows with hundreds of tied
    logits at the boundary (rounded logits) and on peaked ones."""
    from speclm.sampling import _keep_top_k, _keep_top_p, softmax
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal(20_000) * 2) if seed % 2 else rng.standard_normal(20_000) * 3
    p = softmax(x)
    order = _reference_order(p)
    for k in (1, 7, 40, 600):
        got = p.copy()
        _keep_top_k(got, k)
        assert set(np.flatnonzero(got)) == set(order[:k].tolist())
    for top_p in (0.2, 0.9, 0.95):
        got = p.copy()
        _keep_top_p(got, top_p)
        cut = int(np.searchsorted(np.cumsum(p[order]), top_p * (1 - 1e-12), side="left")) + 1
        assert set(np.flatnonzero(got)) == set(order[:cut].tolist())
