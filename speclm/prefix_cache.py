"""Prompt KV reuse across requests (prefix caching).

When a request ends, its KV sequence (prompt and output, exactly what the
target's KV held) is copied to host memory with the tokens it holds. A later
request in the same scope whose prompt starts with some of those tokens gets a
sequence restored from the longest such copy and cut back to the shared
prefix, so it prefills only the rest. This is llama-server's `cache_prompt`
(with its host-memory prompt cache) and vLLM's automatic prefix caching, for
a CPU: on two cores a prompt row costs 20-40 ms, a restore ~4 us a token.
A running request of the same scope lends its KV the same way (`restore(live=)`;
the batching scheduler, speclm/speculative/steps.py, lets a request wait a step for a start
that one ahead of it is prefilling), so a wave of requests with one system
prompt prefills it once, as vLLM's shared prefix blocks do.

Restored KV is bit-identical to what was computed, but the rows after it are
prefilled in a different chunk than a fresh request would use, so greedy
output can differ from an uncached run within batch numerics (the same rule
as batching). Scopes keep tenants apart: whether a prompt was cached shows
in its time to first token, so one API key never reuses another's KV.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .backends.base import Backend
from .errors import BackendError, InvalidRequestError

PREFIX_CACHE_TOKENS = 16_384  # the server's and the bench's default bound (~460 MB of KV on the 1.5B)
PREFIX_CACHE_HELP = ("keep finished requests' KV (prompt and output, host memory) up to N tokens in all, so a "
                     "prompt that starts like an earlier one of the same scope (an API key; a bench arm) prefills "
                     "only the rest (~28 KB a token on the default target; 0: off)")
# tokens: a restore copies the entry's whole KV back (llama.cpp: 0.1-0.2 ms for a 56-token
# copy of the 1.5B, ~1.6 MB) where each prompt row it spares costs 10-30 ms of a forward on a
# CPU, so two tokens already pay (one would also take large entries' copies for one row)
MIN_REUSE = 2
MAX_TOKENS = 10_000_000  # an absurd bound is refused rather than grown into


@dataclass
class _Entry:
    tokens: np.ndarray  # int32, what the saved KV holds
    state: object  # the backend's copy of that KV (Backend.save_sequence)
    nbytes: int


@dataclass
class _ScopeStats:
    lookups: int = 0
    hits: int = 0
    live_hits: int = 0  # hits taken from a running request's KV rather than a finished one's copy
    reused_tokens: int = 0
    evicted: int = 0
    failed: int = 0  # copies llama.cpp would not take out or put back


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def _longest_live(backend: Backend, live: Sequence[int], want: np.ndarray) -> tuple[int | None, int]:
    """(sequence, tokens) of the live sequence whose KV holds the longest start of `want`."""
    return max(((s, common_prefix(np.asarray(backend.tokens(s), dtype=np.int32), want)) for s in live),
               key=lambda x: x[1], default=(None, 0))


class PrefixCache:
    """Finished requests' KV copies, per scope, bounded by `max_tokens` in all
    (least recently used first out). Thread-safe; the caller holds the
    backend's lock around restore and keep (they touch the KV)."""

    def __init__(self, max_tokens: int):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 <= max_tokens <= MAX_TOKENS:
            raise InvalidRequestError(f"the prefix cache size must be an integer number of tokens in "
                                      f"[0, {MAX_TOKENS}] (0: off; --prefix-cache-tokens), got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, tuple[str | None, _Entry]] = OrderedDict()  # oldest first
        self._ids = iter(range(1 << 62))
        self._held = 0
        self._stats: dict[str | None, _ScopeStats] = {}
        self._lock = threading.Lock()

    def restore(self, scope: str | None, backend: Backend, seq: int, tokens: list[int],
                live: Sequence[int] = ()) -> int:
        """Fill the empty sequence `seq` with the longest cached prefix of `tokens` in
        `scope`, or with a longer one held by a live sequence of the same scope (`live`,
        e.g. a request with the same system prompt that is still running); returns how
        many tokens it now holds (0: nothing reused, seq still empty)."""
        want = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            stats = self._stats.setdefault(scope, _ScopeStats())
            stats.lookups += 1
            best, best_n = self._longest(scope, want)
            if best is not None:
                self._entries.move_to_end(best)
                entry = self._entries[best][1]
        donor, donor_n = _longest_live(backend, live, want)
        if max(best_n, donor_n) < MIN_REUSE:
            return 0
        try:
            if donor_n > best_n:
                state, _ = backend.save_sequence(donor)
                backend.load_sequence(seq, state, backend.tokens(donor))
            else:
                backend.load_sequence(seq, entry.state, entry.tokens.tolist())
        except BackendError:  # a copy that will not go back in is dropped; the prompt is prefilled whole
            with self._lock:
                stats.failed += 1
                if donor_n <= best_n and best in self._entries:
                    self._drop(best)
            return 0
        n = max(best_n, donor_n)
        backend.rollback(seq, n)
        with self._lock:
            stats.hits += 1
            stats.live_hits += donor_n > best_n
            stats.reused_tokens += n
        return n

    def reusable(self, scope: str | None, tokens: list[int], backend: Backend | None = None,
                 live: Sequence[int] = ()) -> int:
        """How many of `tokens` a restore would fill now, from the cached copies or the
        live sequences' KV (0: too few to reuse)."""
        want = np.asarray(tokens, dtype=np.int32)
        with self._lock:
            n = self._longest(scope, want)[1]
        if backend is not None:
            n = max(n, _longest_live(backend, live, want)[1])
        return n if n >= MIN_REUSE else 0

    def _longest(self, scope: str | None, want: np.ndarray) -> tuple[int | None, int]:
        best, best_n = None, 0
        for key, (s, entry) in self._entries.items():
            if s == scope:
                n = common_prefix(entry.tokens, want)
                if n > best_n:
                    best, best_n = key, n
        return best, best_n

    def keep(self, scope: str | None, backend: Backend, seq: int) -> None:
        """Save what `seq` holds for later requests in `scope` (before it is freed)."""
        tokens = np.asarray(backend.tokens(seq), dtype=np.int32)
        if not MIN_REUSE <= len(tokens) <= self.max_tokens:
            return
        with self._lock:  # a copy another entry already covers is not worth taking again
            if any(s == scope and common_prefix(e.tokens, tokens) == len(tokens) for s, e in self._entries.values()):
                return
        try:
            state, nbytes = backend.save_sequence(seq)
        except BackendError:  # the request is done either way: it is just not cached
            with self._lock:
                self._stats.setdefault(scope, _ScopeStats()).failed += 1
            return
        with self._lock:
            for key in [k for k, (s, e) in self._entries.items()  # entries the new one covers
                        if s == scope and common_prefix(e.tokens, tokens) == len(e.tokens)]:
                self._drop(key)
            self._entries[next(self._ids)] = (scope, _Entry(tokens, state, nbytes))
            self._held += len(tokens)
            while self._held > self.max_tokens:
                key = next(iter(self._entries))
                self._stats.setdefault(self._entries[key][0], _ScopeStats()).evicted += 1
                self._drop(key)

    def _drop(self, key: int) -> None:
        _, entry = self._entries.pop(key)
        self._held -= len(entry.tokens)

    def clear(self, scope: str | None = None) -> int:
        """Forget `scope`'s copies; returns how many there were."""
        with self._lock:
            keys = [k for k, (s, _) in self._entries.items() if s == scope]
            for key in keys:
                self._drop(key)
            return len(keys)

    def stats(self) -> dict[str | None, dict]:
        """Per scope: entries and tokens held, bytes of KV, lookups, hits (live_hits of them
        from running requests), reused tokens,
        evictions, and copies that failed to go out or back in."""
        with self._lock:
            out: dict[str | None, dict] = {}
            for scope in {*self._stats, *(s for s, _ in self._entries.values())}:
                held = [e for s, e in self._entries.values() if s == scope]
                st = self._stats.get(scope, _ScopeStats())
                out[scope] = {"entries": len(held), "tokens": sum(len(e.tokens) for e in held),
                              "bytes": sum(e.nbytes for e in held), "max_tokens": self.max_tokens,
                              "lookups": st.lookups, "hits": st.hits, "live_hits": st.live_hits,
                              "reused_tokens": st.reused_tokens,
                              "evicted": st.evicted, "failed": st.failed}
            return out
