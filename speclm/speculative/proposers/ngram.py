"""Prompt-lookup (n-gram) proposer: copy what followed the latest earlier
occurrence of the context's last n tokens. Zero model cost; one-hot q."""

from __future__ import annotations

import numpy as np

from ...errors import InvalidRequestError
from ...sampling import SamplingParams, is_int
from .base import Draft, Proposer


def find_continuation(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens after the latest earlier match of the longest suffix n-gram.

    Tries n = max_n down to min_n; for each, the latest occurrence of the last
    n tokens that starts before the suffix itself wins. Returns [] if none.
    """
    ctx = np.asarray(context, dtype=np.int64)
    size = ctx.size
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = ctx[size - n:]
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return ctx[start: start + k].tolist()
    return []


def check_ngram_sizes(min_n: int, max_n: int) -> None:
    if not (is_int(min_n) and is_int(max_n) and 1 <= min_n <= max_n <= 64):
        raise InvalidRequestError(
            f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64 (--ngram-min/--ngram-max), "
            f"got {min_n!r}..{max_n!r}")


class NgramProposer(Proposer):
    """Prompt lookup over prompt + output so far."""

    def __init__(self, min_n: int = 2, max_n: int = 4):
        check_ngram_sizes(min_n, max_n)
        self.min_n, self.max_n = min_n, max_n
        self.name = f"ngram[{min_n}..{max_n}]"

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        tokens = find_continuation(context, k, self.min_n, self.max_n) if k > 0 else []
        return Draft(tokens=tokens, q=[None] * len(tokens))
