"""What a proposer returns, and the interface every proposer implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ...sampling import SamplingParams


@dataclass
class Draft:
    """A drafted block and, per token, the distribution it was drawn from.

    q[i] is the exact distribution d[i] was sampled from, or None when the
    proposer is deterministic for that token (one-hot q at d[i]).
    confidence (optional, one per token) is the proposer's estimate of the
    probability that d[i] is accepted given d[1..i-1] were; it only informs
    how much of the block to verify, never the acceptance rule. match_len,
    support and source qualify those estimates for the controller's
    calibration: the match the draft continues, the occurrences each estimate
    was counted over, where the draft came from ("own", "cache", ...).
    origins (optional, one per token) is (source, match length) where a draft
    spans several sources: token i's estimate rests on that source's match of
    that many tokens (without it, source and match_len + i for every token).
    """

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray | None] = field(default_factory=list)
    confidence: list[float] | None = None
    match_len: int | None = None
    support: tuple[int, ...] | None = None
    source: str | None = None
    origins: tuple[tuple[str | None, int], ...] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        """Keep the first n tokens (and their q and confidence)."""
        del self.tokens[n:], self.q[n:]
        if self.confidence is not None:
            del self.confidence[n:]

    def token_origins(self) -> tuple:
        """Each token's (source, match length): origins, or what source and match_len
        imply for every token (as controller.draft_groups reads a draft without them)."""
        if self.origins is not None:
            return self.origins[:len(self)]
        return tuple((self.source, self.match_len + j if self.match_len else None) for j in range(len(self)))

    def append(self, tokens: list[int], confidence: list[float] | None, origin: tuple[str | None, int | None],
               support: list[int], origins: tuple | None = None) -> None:
        """Append deterministic tokens, keeping the parallel fields aligned: confidence
        (where the draft has estimates), support, and origins (`origin` names the run's
        source and the match length of its first token, unless `origins` gives each)."""
        n = len(self)
        source, length = origin
        new = origins[:len(tokens)] if origins else tuple((source, length + j if length else None)
                                                           for j in range(len(tokens)))
        self.origins = (*self.token_origins(), *new)
        self.support = (*(self.support or [0] * n)[:n], *support)
        if confidence is not None:
            self.confidence = [*(self.confidence or []), *confidence]
        self.source = self.source or source
        self.tokens += list(tokens)
        self.q += [None] * len(tokens)

    def mark_certain(self, positions: range, source: str, estimates: bool) -> None:
        """Tokens at positions are certain (a grammar forces them): estimate 1.0 where the
        draft has estimates, origin (source, None), no support."""
        if not positions:
            return
        n = len(self)
        origins, support = list(self.token_origins()), list((self.support or [0] * n)[:n])
        for i in positions:
            origins[i], support[i] = (source, None), 0
            if estimates and self.confidence is not None:
                self.confidence[i] = 1.0
        self.origins, self.support = tuple(origins), tuple(support)


class Proposer(ABC):
    """Drafts up to k tokens continuing `context`. Never touches the target."""

    name: str
    recuttable = False  # a batched step may verify more or fewer of its drafts than the controller kept, padded

    @abstractmethod
    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Return at most k tokens (possibly none) continuing context."""

    def extend(self, context: list[int], drafted: list[int], k: int) -> Draft:
        """At most k deterministic tokens (with estimates) continuing context + drafted,
        where drafted is certain to follow (a grammar forced its end): a block goes on
        after a forced run. Must not change later drafts (default: none)."""
        return Draft()

    def begin(self, context: list[int], params: SamplingParams) -> None:
        """Called once before the target's prefill: a proposer on other hardware
        may start its own prefill now, in parallel (default: nothing)."""

    def attach(self, target, seq: int) -> None:
        """The request's target backend and KV sequence, once taken (a proposer that
        drafts from the target's own hidden states reads them there; default: nothing)."""

    def verified(self, d: Draft, p: list[np.ndarray], n_accepted: int) -> None:
        """After each round: the draft, the target distributions at the verified positions
        (p_1..p_{a+1}, the request's sampling applied) and a = n_accepted (default: nothing).
        Whatever a proposer learns here must only change later drafts."""

    def round_info(self) -> dict | None:
        """Facts about the last propose() for the round trace (SSD: cache hit, waits)."""
        return None

    def update(self, context: list[int]) -> None:
        """The request's final context, just before close(): a proposer that learns
        from verified output sees the last round too (default: nothing)."""

    def close(self) -> None:
        """Release resources (KV sequences, models). Safe to call twice."""
