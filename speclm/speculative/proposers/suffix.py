"""Suffix decoding (SuffixDecoding, arXiv 2411.04975): a model-free proposer
that learns online.

Two sources of continuations: an index over the request's own prompt and
output (grown on every propose()), and a shared, bounded `SuffixCache` of
earlier requests' prompts and outputs (a request is committed at close()).
The context's longest suffix (up to `max_depth` tokens) that occurs in a
source selects the occurrences to follow; the draft greedily follows the most
frequent next token among them, and each drafted token carries its estimated
conditional acceptance `count(token) / count(occurrences with a next token)`.
The number of tokens drafted grows with the match length
(`spec_factor * match + spec_offset`, at most k). q stays one-hot (None), so
the acceptance rule is unchanged and the output distribution is the target's.
The index and the cache are in suffix_index.py.
"""

from __future__ import annotations

import numpy as np

from ...sampling import SamplingParams
from .base import Draft, Proposer
from .suffix_index import SuffixCache, SuffixConfig, SuffixIndex


class SuffixProposer(Proposer):
    """Drafts from the request's own context first, then the shared cache.

    Both sources are matched; the draft with the higher expected accepted
    length wins, the own context on ties. Each draft carries its per-token
    estimates, the match it continues and its source ("own", "cache", with
    "-first" for an answer's first draft, which continues the chat template's
    header whatever the request asks: run W17), so a controller can keep the
    prefix that pays (the loop asks it: GoodputController.keep).
    One proposer per request; close() commits the request to the cache.
    """

    def __init__(self, cache: SuffixCache | None = None, config: SuffixConfig | None = None):
        self.cache = cache
        self.config = config or SuffixConfig()
        self.name = f"suffix[depth={self.config.max_depth}]"
        self._own = SuffixIndex()
        self._prompt_len = -1
        self._committed = False
        self._info: dict | None = None
        self.counts = {"lookups": 0, "own_hits": 0, "cache_hits": 0, "misses": 0, "drafted": 0}

    def _sync(self, context: list[int]) -> None:
        """Index what is new in context (it only grows within a request)."""
        own = self._own
        n = len(own.tokens)
        if len(context) < n or (n and context[n - 1] != own.tokens[-1]):
            self._own = own = SuffixIndex()  # not a continuation: start over
            n = 0
        if len(context) > n:
            own.extend(context[n:])

    def update(self, context: list[int]) -> None:
        """Learn the context without drafting (e.g. the final round's tokens, just before close())."""
        self._sync(context)

    def begin(self, context: list[int], params: SamplingParams) -> None:
        self._prompt_len = len(context)
        self._own = SuffixIndex()
        self._committed = False
        self._sync(context)

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._sync(context)
        self._info = None
        if k <= 0:
            return Draft()
        cfg = self.config
        best, source = self._own.draft(context, k, cfg, virtual=True), "own"
        if self.cache is not None and (best.expected < len(best.tokens) or len(best.tokens) < k):
            other = self.cache.draft(context, k, cfg)
            if other.expected > best.expected:
                best, source = other, "cache"
        self.counts["lookups"] += 1
        if not best.tokens:
            source = None
            self.counts["misses"] += 1
        else:
            self.counts[f"{source}_hits"] += 1
        first = len(context) == self._prompt_len
        d = Draft(list(best.tokens), [None] * len(best.tokens), list(best.confidence), match_len=best.length,
                  support=tuple(best.support), source=f"{source}-first" if first and source else source)
        self.counts["drafted"] += len(best.tokens)
        self._info = {"source": source, "match": best.length, "drafted": len(best.tokens),
                      "expected": round(best.expected, 3)}
        return d

    def round_info(self) -> dict | None:
        return self._info

    def stats(self) -> dict:
        """This request's counters (and the shared cache's under "cache")."""
        out: dict = dict(self.counts)
        if self.cache is not None:
            out["cache"] = self.cache.stats()
        return out

    def close(self) -> None:
        """Commit the request (prompt and output seen so far) to the cache, once."""
        if not self._committed and self.cache is not None and self._own.tokens:
            self.cache.add(self._own.tokens)
        self._committed = True
