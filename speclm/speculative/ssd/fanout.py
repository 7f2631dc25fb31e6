"""SSD arithmetic (docs/design.md, "SSD"): which verification outcomes to
pre-draft for, and Saguaro sampling. Pure functions over numbers and arrays.

An outcome of verifying a K-token block is (k, t*): k accepted tokens and the
bonus token t*. With per-token acceptance α, P(k) = α^k (1 − α) for k < K and
P(K) = α^K. A budget of B branches is split F_k ∝ P(k)^(1/(1+r)).
"""

from __future__ import annotations

import numpy as np


def outcome_probs(alpha: float, k_block: int) -> np.ndarray:
    """P(k accepted), k = 0..K, under i.i.d. acceptance alpha (sums to 1)."""
    alpha = min(max(alpha, 0.0), 1.0)
    p = np.array([alpha ** k * (1.0 - alpha) for k in range(k_block)] + [alpha ** k_block])
    return p / p.sum()


def allocate_fanout(alpha: float, k_block: int, budget: int, r: float = 1.0,
                    caps: list[int] | None = None) -> list[int]:
    """Branches F_k per outcome position k = 0..K, summing to at most `budget`.

    F_k ∝ P(k)^(1/(1+r)) by largest remainder; caps[k] (candidates available
    at k) bounds each F_k and what a cap frees goes to the next-largest shares.
    """
    n = k_block + 1
    caps = list(caps) if caps is not None else [budget] * n
    weights = outcome_probs(alpha, k_block) ** (1.0 / (1.0 + r))
    out = [0] * n
    left = min(budget, sum(caps))
    while left > 0:
        open_ = [i for i in range(n) if out[i] < caps[i]]
        w = np.array([weights[i] for i in open_])
        share = w / w.sum() * left if w.sum() > 0 else np.full(len(open_), left / len(open_))
        base = np.floor(share).astype(int)
        order = np.argsort(-(share - base), kind="stable")
        for j in order[: left - int(base.sum())]:
            base[j] += 1
        moved = 0
        for j, i in enumerate(open_):
            take = min(int(base[j]), caps[i] - out[i])
            out[i] += take
            moved += take
        if moved == 0:
            break
        left -= moved
    return out


def candidates(logits: np.ndarray, n: int, exclude: int | None = None) -> list[int]:
    """The draft's n most likely tokens (by logit, ties to the lower id), minus `exclude`."""
    if n <= 0:
        return []
    m = min(n + 1, logits.size)
    top = np.argpartition(-logits, m - 1)[:m]
    top = top[np.lexsort((top, -logits[top]))]
    return [int(t) for t in top if t != exclude][:n]


def saguaro(q: np.ndarray, c: float, top: int) -> np.ndarray:
    """Saguaro sampling: q with its `top` most likely tokens' mass scaled by c,
    renormalised. c = 1 returns q itself. Drafts are drawn from the result, and
    the verifier is given exactly the result, so losslessness holds for any c."""
    if c >= 1.0 or top <= 0:
        return q
    out = q.copy()
    m = min(top, int(np.count_nonzero(q)))
    if m == 0 or m == np.count_nonzero(q):
        return q  # scaling every supported token changes nothing after renormalising
    idx = np.argpartition(-q, m - 1)[:m]
    out[idx] *= c
    out /= out.sum()
    return out


class AcceptanceEstimate:
    """EWMA of per-token acceptance, kept separately after a cache hit and after a
    miss (a fallback block is accepted differently from a pre-drafted one)."""

    def __init__(self, prior: float = 0.7, decay: float = 0.8):
        self.value = {True: prior, False: prior}
        self.decay = decay

    def observe(self, after_hit: bool, accepted: int, proposed: int) -> None:
        if proposed > 0:
            old = self.value[after_hit]
            self.value[after_hit] = self.decay * old + (1 - self.decay) * accepted / proposed

    def alpha(self, after_hit: bool) -> float:
        return self.value[after_hit]
