"""The token stream and n-gram index that suffix decoding matches in, and the
shared, bounded cache of earlier requests built on it.

Index: for each level L in LEVELS, a hash map from an L-gram to the
positions it precedes (an int, or a list oldest first). A lookup reads at
most len(LEVELS) maps, then compares at most `max_candidates` recent
occurrences, so its cost does not grow with the cache size. FIFO eviction
cuts the lists' fronts.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from itertools import islice

from ...errors import InvalidRequestError
from ...sampling import is_int
from ...options import option

LEVELS = (1, 2, 4, 8, 16, 32)  # indexed n-gram lengths; matches extend beyond the top one
MAX_DEPTH = 64
MAX_CACHE_TOKENS = 50_000_000  # about 10 GB of index: anything larger is a typo
SEP = -1  # separates requests in a stream; never equals a token id


def _bad(setting: str, rule: str, value: object) -> InvalidRequestError:
    return InvalidRequestError(f"suffix decoding: {setting} must be {rule}, got {value!r}")


SUFFIX_CACHE_TOKENS = 100_000  # each scope's bound on earlier outputs kept for drafting (LLM, server)

@dataclass(frozen=True)
class SuffixConfig:
    """How a SuffixProposer matches and drafts.

    max_depth: longest context suffix matched (1..64).
    min_match: shortest match that may draft (1..max_depth).
    spec_factor, spec_offset: draft at most floor(spec_factor * match) + spec_offset tokens.
    min_prob: stop once the path's estimated probability (product of confidences) < min_prob.
    max_candidates: most recent occurrences of the matched suffix that are compared and counted.
    rematch: a draft whose source runs out before k tokens goes on from a new match of the
        context plus the draft (in any source), up to max_segments matches in all.
    """

    max_depth: int = option(32, "suffix decoding: longest context suffix matched", flag="--suffix-max-depth")
    min_match: int = option(1, "suffix decoding: shortest match that may draft", flag="--suffix-min-match")
    spec_factor: float = option(1.0, "suffix decoding: draft at most this many tokens per matched token "
                                     "(plus --suffix-spec-offset)", flag="--suffix-spec-factor")
    spec_offset: int = option(0, "suffix decoding: tokens drafted beyond spec_factor x match",
                              flag="--suffix-spec-offset")
    min_prob: float = option(0.1, "suffix decoding: stop drafting once the path's estimated probability "
                                  "falls below this", flag="--suffix-min-prob")
    max_candidates: int = option(64, "suffix decoding: most recent occurrences of a match compared",
                                 cli=False)
    rematch: bool = option(False, "suffix decoding: when the source a draft follows runs out (its budget or its "
                                  "occurrences) before k tokens, match the context plus the draft again in every "
                                  "source and go on from the best, so one draft may span several sources",
                           flag="--suffix-rematch")
    max_segments: int = option(4, "suffix decoding: most sources one draft may follow in turn (--suffix-rematch)",
                               flag="--suffix-max-segments")

    def __post_init__(self) -> None:
        if not (is_int(self.max_depth) and 1 <= self.max_depth <= MAX_DEPTH):
            raise _bad("max_depth (longest suffix matched)", f"an integer in [1, {MAX_DEPTH}]", self.max_depth)
        if not (is_int(self.min_match) and 1 <= self.min_match <= self.max_depth):
            raise _bad("min_match", f"an integer in [1, max_depth={self.max_depth}]", self.min_match)
        f = self.spec_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not (0 < f <= MAX_DEPTH):
            raise _bad("spec_factor (draft tokens per matched token)", f"a number in (0, {MAX_DEPTH}]", f)
        if not (is_int(self.spec_offset) and 0 <= self.spec_offset <= MAX_DEPTH):
            raise _bad("spec_offset", f"an integer in [0, {MAX_DEPTH}]", self.spec_offset)
        p = self.min_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise _bad("min_prob", "a probability in [0, 1]", p)
        if not (is_int(self.max_candidates) and 1 <= self.max_candidates <= 4096):
            raise _bad("max_candidates", "an integer in [1, 4096]", self.max_candidates)
        if not isinstance(self.rematch, bool):
            raise _bad("rematch", "true or false", self.rematch)
        if not (is_int(self.max_segments) and 1 <= self.max_segments <= MAX_DEPTH):
            raise _bad("max_segments", f"an integer in [1, {MAX_DEPTH}]", self.max_segments)

    def budget(self, match: int, k: int) -> int:
        """Tokens a match of this length may draft (at most k)."""
        if match < self.min_match:
            return 0
        return max(0, min(k, math.floor(self.spec_factor * match) + self.spec_offset))


@dataclass
class Match:
    """A source's best draft: the matched suffix length, tokens, confidences,
    and each confidence's support (occurrences it was counted over)."""

    length: int = 0
    tokens: tuple[int, ...] = ()
    confidence: tuple[float, ...] = ()
    support: tuple[int, ...] = ()

    @property
    def expected(self) -> float:
        """Expected accepted tokens if all are verified: Σ_j Π_{i≤j} c_i."""
        total, prob = 0.0, 1.0
        for c in self.confidence:
            prob *= c
            total += prob
        return total


class SuffixIndex:
    """A token stream (requests separated by SEP) and its n-gram → positions maps.

    Positions are global and never reused: stream[g] is at tokens[g - base].
    The entry g under level L records that stream[g-L:g] (one request) was
    followed by stream[g]. Not thread-safe: SuffixCache locks around it.
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.base = 0  # global position of tokens[0]
        self.seq_start = 0  # global position where the open request starts
        self.maps: list[dict[int, int | list[int]]] = [{} for _ in LEVELS]

    @property
    def end(self) -> int:
        return self.base + len(self.tokens)

    def extend(self, new: list[int]) -> None:
        """Append tokens to the open request, indexing every n-gram they complete."""
        toks, maps = self.tokens, self.maps
        for t in new:
            i = len(toks)
            g = self.base + i
            avail = g - self.seq_start
            for L, m in zip(LEVELS, maps):
                if L > avail:
                    break
                key = hash(tuple(toks[i - L:i]))
                occ = m.get(key)
                if occ is None:
                    m[key] = g  # one occurrence: a bare int (most n-grams; saves memory)
                elif type(occ) is int:
                    m[key] = [occ, g]
                else:
                    occ.append(g)
            toks.append(int(t))

    def close_request(self) -> tuple[int, int]:
        """End the open request; return its span [start, end) (global)."""
        span = (self.seq_start, self.end)
        self.tokens.append(SEP)
        self.seq_start = self.end
        return span

    def evict_front(self, start: int, end: int) -> None:
        """Drop the oldest request, span [start, end), and its separator."""
        toks, base = self.tokens, self.base
        for L, m in zip(LEVELS, self.maps):
            keys = {hash(tuple(toks[g - base - L:g - base])) for g in range(start + L, end)}
            for key in keys:
                occ = m.get(key)
                if occ is None:
                    continue
                if type(occ) is int:
                    if occ < end:
                        del m[key]
                    continue
                del occ[:bisect_left(occ, end)]  # oldest first: the evicted ones lead
                if len(occ) <= 1:
                    if occ:
                        m[key] = occ[0]
                    else:
                        del m[key]
        del toks[:end + 1 - base]
        self.base = end + 1

    def find(self, query: list[int], max_depth: int, max_candidates: int) -> tuple[int, list[int]]:
        """(length, positions): the longest suffix of query (≤ max_depth) that
        occurs followed by a token, and the global end positions of its most
        recent occurrences among the latest max_candidates (newest first)."""
        n = len(query)
        top: tuple[int, int | list[int]] | None = None
        for L, m in zip(LEVELS, self.maps):
            if L > n or L > max_depth:
                break
            occ = m.get(hash(tuple(query[n - L:])))
            if occ is None:
                break  # a longer suffix occurs only where this one does
            top = (L, occ)
        if top is None:
            return 0, []
        L, occ = top
        newest_first = (occ,) if type(occ) is int else islice(reversed(occ), max_candidates)
        toks, base, tail = self.tokens, self.base, query[n - L:]
        limit = min(max_depth, n)
        best, found = 0, []
        for g in newest_first:
            i = g - base
            if toks[i - L:i] != tail:  # a hash collision
                continue
            length = L
            while length < limit and i - length > 0 and toks[i - length - 1] == query[n - length - 1]:
                length += 1
            if length > best:
                best, found = length, [g]
            elif length == best:
                found.append(g)
        return best, found

    def walk(self, positions: list[int], budget: int, min_prob: float, virtual: bool, prob: float = 1.0,
             drafted: tuple[int, ...] = ()) -> Match:
        """Follow the most frequent next token from the given occurrences for up
        to `budget` steps; ties go to the most recent occurrence. With
        `virtual`, the stream continues into the draft itself (a repeat that
        runs up to the end of the context keeps copying). prob, drafted: the
        path probability and the tokens of the draft before this walk (the
        virtual stream continues with them first)."""
        toks, base, limit = self.tokens, self.base, len(self.tokens)
        ahead = len(drafted)
        out = list(drafted)  # the virtual stream beyond the context: the draft before this walk, then its tokens
        conf: list[float] = []
        support: list[int] = []
        pos = [g - base for g in positions]
        while len(out) - ahead < budget and pos:
            nxt = [toks[i] if i < limit else (out[i - limit] if virtual else SEP) for i in pos]
            counts: dict[int, int] = {}
            for t in nxt:
                if t != SEP:
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                break
            tok = max(counts, key=counts.__getitem__)
            n = sum(counts.values())
            c = counts[tok] / n
            prob *= c
            if prob < min_prob:
                break
            out.append(tok)
            conf.append(c)
            support.append(n)
            pos = [i + 1 for i, t in zip(pos, nxt) if t == tok]
        return Match(0, tuple(out[ahead:]), tuple(conf), tuple(support))

    def draft(self, query: list[int], k: int, cfg: SuffixConfig, virtual: bool = False, prob: float = 1.0,
              drafted: tuple[int, ...] = ()) -> Match:
        """The walk from the longest match of query's suffix (query ends with `drafted`, the
        draft so far, when a draft goes on from a new match: suffix.SuffixProposer)."""
        length, positions = self.find(query, cfg.max_depth, cfg.max_candidates)
        budget = cfg.budget(length, k)
        if budget == 0:
            return Match(length)
        m = self.walk(positions, budget, cfg.min_prob, virtual, prob, drafted)
        m.length = length
        return m


class SuffixCache:
    """Earlier requests' prompts and outputs, shared by the requests of one
    scope (the caller decides: per LLM, per API key — a shared cache is a
    timing side channel). At most `max_tokens` tokens; the oldest requests
    are evicted first. max_tokens = 0 disables it. Thread-safe."""

    def __init__(self, max_tokens: int = SUFFIX_CACHE_TOKENS):
        if not (is_int(max_tokens) and 0 <= max_tokens <= MAX_CACHE_TOKENS):
            raise _bad("cache size max_tokens (shared suffix cache, in tokens; 0 disables it)",
                       f"an integer in [0, {MAX_CACHE_TOKENS}]", max_tokens)
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        """Forget every cached request and reset the counters."""
        with self._lock:
            self._index = SuffixIndex()
            self._spans: deque[tuple[int, int]] = deque()
            self._tokens = 0
            self._lookups = self._hits = self._evicted = self._added = 0

    def add(self, tokens: list[int]) -> None:
        """Commit one finished request (prompt + verified output). A request
        longer than the cache keeps its last max_tokens tokens."""
        if self.max_tokens == 0 or not tokens:
            return
        tokens = list(tokens[-self.max_tokens:])
        with self._lock:
            while self._spans and self._tokens + len(tokens) > self.max_tokens:
                start, end = self._spans.popleft()
                self._index.evict_front(start, end)
                self._tokens -= end - start
                self._evicted += 1
            self._index.extend(tokens)
            self._spans.append(self._index.close_request())
            self._tokens += len(tokens)
            self._added += 1

    def draft(self, query: list[int], k: int, cfg: SuffixConfig, prob: float = 1.0) -> Match:
        """The best continuation of query in the cache (counted as a lookup)."""
        if self.max_tokens == 0:
            return Match()
        with self._lock:
            m = self._index.draft(query, k, cfg, prob=prob)
            self._lookups += 1
            self._hits += bool(m.tokens)
            return m

    def stats(self) -> dict:
        """Counters for metrics: lookups, hits, misses, cached requests and tokens."""
        with self._lock:
            return {"lookups": self._lookups, "hits": self._hits, "misses": self._lookups - self._hits,
                    "cached_requests": len(self._spans), "cached_tokens": self._tokens,
                    "max_tokens": self.max_tokens, "added_requests": self._added,
                    "evicted_requests": self._evicted}
