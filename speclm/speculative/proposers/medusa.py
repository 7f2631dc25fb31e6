"""Medusa proposer: head i drafts token i from the target's hidden state at the
last position in the KV (the target's own output head gives the pending token).

Every drafted token carries the exact head distribution q it was drawn from
(greedy: deterministic, the head's argmax), so the usual acceptance rule keeps
the output exactly the target's. With a learner, each round's verified
distributions teach the heads (heads/online.py); outputs stay lossless because
each round uses the q it actually drafted from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...costs import clock_ms
from ...errors import InvalidRequestError
from ...heads.model import MedusaHeads, one_blas_thread, softmax_rows
from ...heads.online import OnlineLearner
from ...sampling import SamplingParams, keyed_sample
from ...options import option
from .base import Draft, Proposer

HISTORY = 64  # hidden states kept per request (positions), for pairing with later distributions


class MedusaProposer(Proposer):
    def __init__(self, heads: MedusaHeads, learner: OnlineLearner | None = None, name: str = "medusa"):
        self.heads, self.learner, self.name = heads, learner, name
        self.target = self.seq = None
        self._history: dict[int, np.ndarray] = {}  # position -> hidden state
        self._drafted_from: int | None = None  # position of the hidden state this round drafted from
        self.heads_ms = self.learn_ms = 0.0

    def attach(self, target, seq: int) -> None:
        self.target, self.seq = target, seq

    def _remember(self) -> int | None:
        """Add the latest forward's hidden states to the history; the position of its first row."""
        kept = self.target.hidden_states(self.seq) if self.target is not None else None
        if kept is None:
            return None
        start, rows = kept
        for r, h in enumerate(rows):
            self._history[start + r] = h
        for pos in [p for p in self._history if p < start + len(rows) - HISTORY]:
            del self._history[pos]
        return start

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        t0 = clock_ms()
        self._remember()
        pos = len(context) - 2  # the last position in the target's KV
        h = self._history.get(pos)
        self._drafted_from = pos
        if h is None or k <= 0:
            return Draft()
        with one_blas_thread():
            logits = self.heads.logits(h, k).astype(np.float64)
        ids = self.heads.vocab_ids
        d = Draft(confidence=[])
        if params.greedy:
            q = softmax_rows(logits)
            for row in q:
                j = int(np.argmax(row))
                d.tokens.append(int(ids[j]))
                d.q.append(None)
                d.confidence.append(float(row[j]))
        else:
            q = softmax_rows(logits / params.temperature)
            for i, row in enumerate(q):
                full = np.zeros(self.heads.vocab_size)
                full[ids] = row
                if params.seed is None:
                    tok = int(ids[int(rng.choice(len(row), p=row))])
                else:  # the noise of the position head i drafts (sampling.draw)
                    tok = keyed_sample(full, params.seed, len(context) + i)
                d.tokens.append(tok)
                d.q.append(full)
                d.confidence.append(float(full[tok]))
        self.heads_ms = clock_ms() - t0
        return d

    def round_info(self) -> dict | None:
        return {"heads_ms": round(self.heads_ms, 3), "learn_ms": round(self.learn_ms, 3)}

    def verified(self, d: Draft, p: list[np.ndarray], n_accepted: int) -> None:
        """The round's verified distributions p (rows at positions start..start+n_accepted)
        become distillation targets: p_j teaches head i at the hidden state of position j - i."""
        if self.learner is None:
            return
        start = self._remember()
        if start is None:
            return
        for r, p_j in enumerate(p[:n_accepted + 1]):
            j = start + r
            for i in range(1, self.heads.n_heads + 1):
                h = self._history.get(j - i)
                if h is not None:
                    rejected = j - i == self._drafted_from and i - 1 == n_accepted and n_accepted < len(d)
                    self.learner.add(i - 1, h, p_j, rejected)
        with one_blas_thread():
            self.learn_ms = self.learner.step()


@dataclass(frozen=True)
class MedusaOptions:
    """Method medusa's own settings. heads: a heads file (None: the heads trained for
    the target, `speclm heads train`, else the ones shipped with speclm); online: adapt
    the heads from every round's verification (per LLM, per API key in the server)."""

    heads: str | None = option(None, "medusa: heads file (default: the heads trained for the target)",
                               flag="--heads")
    online: bool = option(False, "medusa: adapt the heads online from the target's verified distributions",
                          flag="--heads-online")
    online_lr: float = option(3e-4, "medusa: Adam learning rate of online adaptation", flag="--heads-online-lr")
    online_budget_ms: float = option(15.0, "medusa: most ms of head updates per round",
                                     flag="--heads-online-budget-ms")

    def __post_init__(self) -> None:
        if self.heads is not None and not isinstance(self.heads, str):
            raise InvalidRequestError(f"heads must be a file path, got {self.heads!r}")
        if not isinstance(self.online, bool):
            raise InvalidRequestError(f"online must be true or false, got {self.online!r}")
        for name in ("online_lr", "online_budget_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6:
                raise InvalidRequestError(f"{name} must be a positive number, got {v!r}")
