"""Exact target distributions on the toy backend and the sample-size bound
used by every losslessness test."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from speclm.backends.toy import ToyBackend
from speclm.sampling import SamplingParams, target_probs


def exact_distribution(target: ToyBackend, prompt: list[int], params: SamplingParams,
                       n_tokens: int) -> dict[tuple[int, ...], float]:
    """P(first n_tokens generated = s) for every s, by enumeration."""
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(target.vocab_size), repeat=n_tokens):
        prob, ctx = 1.0, list(prompt)
        for tok in seq:
            prob *= target_probs(target.logits_for(ctx), params)[tok]
            if prob == 0.0:
                break
            ctx.append(tok)
        if prob > 0:
            out[seq] = prob
    return out


def tv_bound(n_samples: int, n_outcomes: int, delta: float = 1e-6) -> float:
    """A total-variation radius that the empirical distribution of n i.i.d.
    samples exceeds with probability < delta (Bretagnolle–Huber–Carol:
    P(TV >= t) <= 2^M exp(-2 n t^2), M outcomes)."""
    return math.sqrt((n_outcomes * math.log(2) + math.log(1 / delta)) / (2 * n_samples))


def total_variation(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    counts = Counter(samples)
    n = len(samples)
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(s, 0) / n - exact.get(s, 0.0)) for s in keys)


def support_size(exact: dict) -> int:
    return max(1, len(exact))


def empirical_check(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> tuple[float, float]:
    """(observed TV, allowed bound). Outcomes outside the exact support must never occur."""
    impossible = [s for s in samples if s not in exact]
    assert not impossible, f"sampled sequences the target gives zero probability: {impossible[:3]}"
    return total_variation(samples, exact), tv_bound(len(samples), support_size(exact))


def first_tokens(result_ids: list[int], n: int) -> tuple[int, ...]:
    return tuple(result_ids[:n])


def np_seed_sequence(base: int, count: int) -> list[int]:
    return [int(x) for x in np.random.SeedSequence(base).generate_state(count)]
