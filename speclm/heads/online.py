"""Online adaptation of Medusa heads from the target's verification feedback.

Every round scores the target at the verified positions; its distribution p_j
at position j is the distillation target of head i for the hidden state at
position j - i (Online Speculative Decoding, arXiv 2310.07177: minimise
KL(p ‖ head)). Pairs are buffered per head and one head takes one Adam step
once it has `batch` pairs, so a round pays for at most one update (a pass over
the output matrix), and never more than `budget_ms` of updates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .model import Adam, MedusaHeads

REJECTED_WEIGHT = 2.0  # the position where the head's own draft was rejected counts double (OSD's focus)


@dataclass
class OnlineLearner:
    """Adapts `heads` in place. Not thread-safe: callers hold the LLM's backend lock."""

    heads: MedusaHeads
    lr: float = 3e-4
    batch: int = 16
    budget_ms: float = 15.0
    updates: int = 0
    pairs_seen: int = 0
    ms_total: float = 0.0
    _buffers: list[list[tuple[np.ndarray, np.ndarray, float]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._adam = Adam(self.heads, lr=self.lr)
        self._buffers = [[] for _ in range(self.heads.n_heads)]

    def add(self, head: int, h: np.ndarray, p: np.ndarray, rejected: bool = False) -> None:
        """Head `head` (0-based) should have predicted distribution p (over the target's
        vocabulary) from hidden state h. Ignored when p's mass lies mostly outside V'."""
        y = np.asarray(p)[self.heads.vocab_ids]
        mass = float(y.sum())
        if mass < 0.5:
            return
        self._buffers[head].append((h, (y / mass).astype(np.float32), REJECTED_WEIGHT if rejected else 1.0))
        self.pairs_seen += 1

    def step(self) -> float:
        """Update the fullest head if it has a batch; returns the ms spent."""
        t0 = time.perf_counter()
        head = max(range(len(self._buffers)), key=lambda i: len(self._buffers[i]))
        while self._buffers[head] and len(self._buffers[head]) >= self.batch:
            items, self._buffers[head] = self._buffers[head][:self.batch], self._buffers[head][self.batch:]
            H = np.stack([h for h, _, _ in items]).astype(np.float32)
            Y = np.stack([y for _, y, _ in items])
            w = np.array([w for _, _, w in items], np.float32)
            dW, db, _ = self.heads.grads(head, H, Y, w)
            self._adam.step(head, dW, db)
            self.updates += 1
            if (time.perf_counter() - t0) * 1000 >= self.budget_ms:
                break
        for buf in self._buffers:
            del buf[:-4 * self.batch]  # a head that cannot keep up drops its oldest pairs
        ms = (time.perf_counter() - t0) * 1000
        self.ms_total += ms
        return ms
