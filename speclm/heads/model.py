"""Medusa heads: K small residual blocks on the target's final hidden state.

Head i (i = 1..K) maps the hidden state h_t of the last position in the KV to
a distribution over token t+1+i (the target's own output head already gives
t+1): h' = h + SiLU(W_i h + b_i), logits = E h', where E is the target's
output matrix restricted to the V' most frequent tokens (`vocab_ids`). Tokens
outside V' are never drafted; losslessness does not depend on which tokens a
proposer can reach.

Plain numpy, float32. W starts at zero, so an untrained head i predicts what
the target predicts for t+1 (Medusa's initialisation).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import ThreadpoolController

_BLAS = ThreadpoolController()


def one_blas_thread() -> AbstractContextManager:
    """Run numpy's BLAS on the calling thread only. OpenBLAS's worker threads spin
    after each call and take the cores from the next llama.cpp forward: measured here,
    a 2-token verify went from 76 to 155 ms after one heads matmul with threads on."""
    return _BLAS.limit(limits=1, user_api="blas")


def silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def silu_grad(z: np.ndarray) -> np.ndarray:
    s = 1.0 / (1.0 + np.exp(-z))
    return s * (1.0 + z * (1.0 - s))


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class MedusaHeads:
    """K heads over one target. W: (K, d, d) float32, b: (K, d), out: (V', d) rows of
    the target's output matrix for `vocab_ids` (V',), ids of the target's vocabulary
    (`vocab_size`). `target_sha256` names the target the heads were trained for."""

    W: np.ndarray
    b: np.ndarray
    out: np.ndarray
    vocab_ids: np.ndarray
    vocab_size: int
    target_sha256: str = ""
    meta: dict = field(default_factory=dict)

    @classmethod
    def random(cls, vocab_size: int, hidden_size: int, n_heads: int = 3, seed: int = 5,
               scale: float = 1.5) -> MedusaHeads:
        """Untrained heads with seeded random weights over the whole vocabulary: drafts
        unlike any target's (the toy backend's tests and scripts draft with them)."""
        rng = np.random.default_rng(seed)
        return cls(rng.standard_normal((n_heads, hidden_size, hidden_size)) * 0.5,
                   rng.standard_normal((n_heads, hidden_size)),
                   rng.standard_normal((vocab_size, hidden_size)) * scale, np.arange(vocab_size), vocab_size)

    def __post_init__(self) -> None:
        self.W = np.ascontiguousarray(self.W, dtype=np.float32)
        self.b = np.ascontiguousarray(self.b, dtype=np.float32)
        self.out = np.ascontiguousarray(self.out, dtype=np.float32)
        self.vocab_ids = np.asarray(self.vocab_ids, dtype=np.int64)
        k, d, d2 = self.W.shape
        if d != d2 or self.b.shape != (k, d) or self.out.shape != (len(self.vocab_ids), d):
            raise ValueError(f"inconsistent head shapes: W {self.W.shape}, b {self.b.shape}, "
                             f"out {self.out.shape}, vocab_ids {self.vocab_ids.shape}")
        if len(self.vocab_ids) and not 0 <= int(self.vocab_ids.min()) <= int(self.vocab_ids.max()) < self.vocab_size:
            raise ValueError(f"vocab_ids must lie in [0, {self.vocab_size})")
        self._index = np.full(self.vocab_size, -1, dtype=np.int64)  # target id -> row of out (-1: not in V')
        self._index[self.vocab_ids] = np.arange(len(self.vocab_ids))

    @classmethod
    def fresh(cls, n_heads: int, out: np.ndarray, vocab_ids: np.ndarray, vocab_size: int,
              target_sha256: str = "") -> MedusaHeads:
        d = out.shape[1]
        return cls(np.zeros((n_heads, d, d), np.float32), np.zeros((n_heads, d), np.float32),
                   out, vocab_ids, vocab_size, target_sha256)

    @property
    def n_heads(self) -> int:
        return self.W.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.W.shape[1]

    def index_of(self, token_ids: np.ndarray) -> np.ndarray:
        """Rows of V' for target token ids (-1 where a token is outside V')."""
        return self._index[np.asarray(token_ids, dtype=np.int64)]

    def copy(self) -> MedusaHeads:
        """Own W and b (to adapt online), sharing the read-only output matrix."""
        twin = MedusaHeads.__new__(MedusaHeads)
        twin.__dict__.update(self.__dict__)
        twin.W, twin.b, twin.meta = self.W.copy(), self.b.copy(), dict(self.meta)
        return twin

    # ---- inference -------------------------------------------------------
    def logits(self, h: np.ndarray, n: int | None = None) -> np.ndarray:
        """(n, V') logits of heads 1..n for one hidden state h (d,)."""
        n = self.n_heads if n is None else min(n, self.n_heads)
        h = np.asarray(h, dtype=np.float32)
        d = self.hidden_size
        z = (self.W[:n].reshape(n * d, d) @ h).reshape(n, d) + self.b[:n]  # one gemv over all heads' blocks
        return (h + silu(z)) @ self.out.T  # one pass over the output matrix for all heads

    def head_logits(self, head: int, H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Head `head` (0-based) over hidden states H (N, d): its pre-activation Z and logits (N, V')."""
        Z = H @ self.W[head].T + self.b[head]
        return Z, (H + silu(Z)) @ self.out.T

    # ---- training --------------------------------------------------------
    def grads(self, head: int, H: np.ndarray, Y: np.ndarray,
              weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
        """Gradients of the mean weighted cross-entropy of head `head` (0-based) on hidden
        states H (N, d) against target distributions Y (N, V') (rows sum to 1), and the loss.
        Minimising it minimises KL(Y ‖ head)."""
        Z, logits = self.head_logits(head, H)
        Q = softmax_rows(logits)
        w = np.ones(len(H), np.float32) if weights is None else weights.astype(np.float32)
        norm = max(float(w.sum()), 1e-9)
        loss = float(-(w * (Y * np.log(Q + 1e-12)).sum(axis=1)).sum() / norm)
        G = (Q - Y) * (w / norm)[:, None]
        dZ = (G @ self.out) * silu_grad(Z)
        return dZ.T @ H, dZ.sum(axis=0), loss


class Adam:
    """Adam over the heads' W and b (offline training)."""

    def __init__(self, heads: MedusaHeads, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999)):
        self.heads, self.lr, self.betas = heads, lr, betas
        self.m = [np.zeros_like(heads.W), np.zeros_like(heads.b)]
        self.v = [np.zeros_like(heads.W), np.zeros_like(heads.b)]
        self.t = np.zeros(heads.n_heads, np.int64)

    def step(self, head: int, dW: np.ndarray, db: np.ndarray) -> None:
        b1, b2 = self.betas
        self.t[head] += 1
        t = int(self.t[head])
        for i, (param, g) in enumerate(((self.heads.W, dW), (self.heads.b, db))):
            m, v = self.m[i][head], self.v[i][head]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            param[head] -= self.lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + 1e-8)

    def state(self) -> dict[str, np.ndarray]:
        return {"adam_mW": self.m[0], "adam_mb": self.m[1], "adam_vW": self.v[0], "adam_vb": self.v[1],
                "adam_t": self.t}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.m = [state["adam_mW"].copy(), state["adam_mb"].copy()]
        self.v = [state["adam_vW"].copy(), state["adam_vb"].copy()]
        self.t = state["adam_t"].copy()
