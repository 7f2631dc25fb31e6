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
The index and the cache are in suffix_index.py. A request may bring a third
source, checked first: the client's prediction of its output (prediction.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...sampling import SamplingParams
from .base import Draft, Proposer
from .prediction import Prediction
from .suffix_index import Match, SuffixCache, SuffixConfig, SuffixIndex


class SuffixProposer(Proposer):
    """Drafts from the request's own context first, then the shared cache.

    A request's prediction (predict()) drafts first while the answer follows it
    (it agreed with the prediction's last token, or realigned on it); otherwise
    it competes like the others. Both sources are matched; the draft with the higher expected accepted
    length wins, the own context on ties. With config.rematch, a draft whose
    source runs out before k tokens goes on from a new match of the context
    plus the draft so far (in either source), and names every token's origin
    (its source and the match its estimate rests on). Each draft carries its per-token
    estimates, the match it continues and its source ("own", "cache", with
    "-first" for an answer's first draft, which continues the chat template's
    header whatever the request asks), so a controller can keep the
    prefix that pays (the loop asks it: GoodputController.keep).
    One proposer per request; close() commits the request to the cache.
    """

    recuttable = True  # drafts are deterministic, with estimates; no verified draft teaches it

    def __init__(self, cache: SuffixCache | None = None, config: SuffixConfig | None = None):
        self.cache = cache
        self.config = config or SuffixConfig()
        self.name = f"suffix[depth={self.config.max_depth}]"
        self._own = SuffixIndex()
        self._prompt_len = -1
        self._committed = False
        self._info: dict | None = None
        self.prediction: Prediction | None = None
        self.counts = {"lookups": 0, "own_hits": 0, "cache_hits": 0, "misses": 0, "drafted": 0}

    def predict(self, tokens: list[int], piece: Callable[[int], bytes] | None = None) -> None:
        """The client's expected output: a source followed in order, matched first
        (piece: the tokenizer's bytes per token, for realigning after a substitution)."""
        self.prediction = Prediction(tokens, piece)
        self.counts["prediction_hits"] = 0

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

    def _match(self, context: list[int], drafted: list[int], k: int, prob: float) -> tuple[Match, str | None]:
        """The better source's draft of up to k tokens continuing context + drafted."""
        cfg, query = self.config, context + drafted if drafted else context
        best, source = self._own.draft(query, k, cfg, virtual=True, prob=prob, drafted=tuple(drafted)), "own"
        if self.prediction is not None and not drafted:
            predicted = self.prediction.draft(k)  # first while the answer follows it; else the likelier
            if predicted.tokens and (self.prediction.run > 0 or predicted.expected >= best.expected):
                best, source = predicted, Prediction.source
        if self.cache is not None and (best.expected < len(best.tokens) or len(best.tokens) < k):
            other = self.cache.draft(query, k, cfg, prob=prob)
            if other.expected > best.expected:
                best, source = other, "cache"
        return best, source if best.tokens else None

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._sync(context)
        self._info = None
        if k <= 0:
            return Draft()
        if self.prediction is not None:
            self.prediction.follow(context[self._prompt_len:])
        best, source = self._match(context, [], k, 1.0)
        self.counts["lookups"] += 1
        self.counts[f"{source}_hits" if source else "misses"] += 1
        first = f"{source}-first" if source in ("own", "cache") and len(context) == self._prompt_len else source
        tokens, confidence, support = list(best.tokens), list(best.confidence), list(best.support)
        segments = [first] if source else []
        origins = [(first, best.length + j) for j in range(len(tokens))] if self.config.rematch else []
        prob = float(np.prod(confidence)) if self.config.rematch else 1.0
        while (self.config.rematch and tokens and len(tokens) < k and len(segments) < self.config.max_segments
               and prob >= self.config.min_prob):
            more, where = self._match(context, tokens, k - len(tokens), prob)
            if where is None:
                break
            origins += [(where, more.length + j) for j in range(len(more.tokens))]
            tokens += more.tokens
            confidence += more.confidence
            support += more.support
            prob *= float(np.prod(more.confidence))
            segments.append(where)
        d = Draft(tokens, [None] * len(tokens), confidence, match_len=best.length, support=tuple(support),
                  source=first, origins=tuple(origins) if len(segments) > 1 else None)
        self.counts["drafted"] += len(tokens)
        self._info = {"source": source, "match": best.length, "drafted": len(tokens),
                      "expected": round(best.expected, 3)}
        if len(segments) > 1:
            self._info["segments"] = segments
        return d

    def extend(self, context: list[int], drafted: list[int], k: int) -> Draft:
        """The better source's continuation of context + drafted (a forced run ends it)."""
        self._sync(context)
        if k <= 0:
            return Draft()
        best, source = self._match(context, drafted, k, 1.0)
        tokens = list(best.tokens)
        self.counts["drafted"] += len(tokens)
        return Draft(tokens, [None] * len(tokens), list(best.confidence), match_len=best.length,
                     support=tuple(best.support), source=source)

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
