"""Choosing K every round from measured costs and acceptance (method `auto`),
and the +2/−1 heuristic it is compared with (method `heuristic`).

Goodput rule: with per-token acceptance α, a round drafting K tokens emits
E(K) = (1 − α^(K+1)) / (1 − α) tokens in expectation and costs
c·K + v(K+1) + o ms (c: draft ms per token, v(b): ms to score a block of b
tokens, o: per-round overhead). Pick the K in 0..K_max maximising
E(K) / cost(K); K = 0 is a plain decoding step. If no K > 0 would pay even at
an optimistic acceptance (OPTIMISTIC_ALPHA) — e.g. a draft model whose step
costs most of a target step — speculation is off and no probe is spent.
Otherwise, while at K = 0 a one-token
probe runs every `probe_every` rounds; a fully accepted probe is followed at
once by one twice as long, so a workload that turns predictable brings
speculation back within a few probes, while on an unpredictable one the
probes cost about 1/probe_every of a round each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..backends.base import Backend
from ..metrics import RoundRecord


@dataclass
class CostModel:
    """Measured costs of one (target, proposer) pair, shared by all requests.

    verify_ms[b]: EWMA of the ms to score a block of b tokens (b = K + 1).
    Unmeasured sizes are extrapolated linearly from the nearest measured ones.
    """

    verify_ms: dict[int, float] = field(default_factory=dict)
    draft_ms_per_token: float = 0.0
    other_ms: float = 0.5
    weight: float = 0.2  # EWMA weight of a new observation

    def verify(self, block: int) -> float:
        if block in self.verify_ms:
            return self.verify_ms[block]
        sizes = sorted(self.verify_ms)
        if not sizes:
            return float(block)
        lower = [s for s in sizes if s < block]
        upper = [s for s in sizes if s > block]
        if lower and upper:
            a, b = lower[-1], upper[0]
            t = (block - a) / (b - a)
            return self.verify_ms[a] * (1 - t) + self.verify_ms[b] * t
        if len(sizes) == 1:
            return self.verify_ms[sizes[0]] * block / sizes[0]
        a, b = (sizes[-2], sizes[-1]) if lower else (sizes[0], sizes[1])
        slope = (self.verify_ms[b] - self.verify_ms[a]) / (b - a)
        return max(1e-3, self.verify_ms[b if lower else a] + slope * (block - (b if lower else a)))

    def observe(self, rec: RoundRecord) -> None:
        block = rec.proposed + 1
        old = self.verify_ms.get(block)
        self.verify_ms[block] = rec.verify_ms if old is None else old + self.weight * (rec.verify_ms - old)
        if rec.proposed:
            per_token = rec.draft_ms / rec.proposed
            self.draft_ms_per_token += self.weight * (per_token - self.draft_ms_per_token)
        self.other_ms += self.weight * (rec.other_ms - self.other_ms)

    def round_ms(self, k: int) -> float:
        return self.draft_ms_per_token * k + self.verify(k + 1) + self.other_ms


def calibrate(target: Backend, draft: Backend | None, max_block: int, repeats: int = 2) -> CostModel:
    """Seed a CostModel by timing blocks of 1..max_block tokens on the target
    (and single steps on the draft), on a scratch sequence."""
    cost = CostModel()
    filler = [1] * 64
    for block in range(1, max_block + 1):
        times = []
        for _ in range(repeats):
            seq = target.new_sequence()
            try:
                target.prefill(seq, filler)
                t0 = time.perf_counter()
                target.score(seq, filler[:block])
                times.append((time.perf_counter() - t0) * 1000)
            finally:
                target.free(seq)
        cost.verify_ms[block] = min(times)
    if draft is not None:
        seq = draft.new_sequence()
        try:
            draft.prefill(seq, filler)
            times = []
            for tok in filler[:4]:
                t0 = time.perf_counter()
                draft.score(seq, [tok])
                times.append((time.perf_counter() - t0) * 1000)
            cost.draft_ms_per_token = min(times)
        finally:
            draft.free(seq)
    return cost


def expected_emitted(alpha: float, k: int) -> float:
    """E[tokens per round] for i.i.d. acceptance alpha and K = k (design note §2)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


OPTIMISTIC_ALPHA = 0.98


class GoodputController:
    """Per-request K choice; acceptance is per sequence, costs are shared."""

    def __init__(self, cost: CostModel, k_max: int, alpha_prior: float = 0.5,
                 prior_weight: float = 2.0, decay: float = 0.9, probe_every: int = 16):
        self.cost, self.k_max = cost, k_max
        self.decay, self.probe_every = decay, probe_every
        self.accepted = alpha_prior * prior_weight  # decayed pseudo-counts
        self.rejected = (1 - alpha_prior) * prior_weight
        self.rounds_at_zero = 0
        self.probe_k = 0  # > 0: the last probe was fully accepted; probe again with this K
        self._probing = 0  # K of the probe in flight (0: none)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def rate(self, k: int) -> float:
        """Expected emitted tokens per ms when drafting k."""
        return expected_emitted(self.alpha, k) / self.cost.round_ms(k)

    def could_pay(self, cap: int) -> bool:
        """Would some K in 1..cap beat plain decoding at an optimistic acceptance?"""
        plain = 1.0 / self.cost.round_ms(0)
        return any(expected_emitted(OPTIMISTIC_ALPHA, k) / self.cost.round_ms(k) > plain
                   for k in range(1, cap + 1))

    def choose(self, k_cap: int) -> tuple[int, str]:
        cap = min(self.k_max, k_cap)
        best = max(range(cap + 1), key=self.rate)
        if best == 0 and cap >= 1 and not self.could_pay(cap):
            self.probe_k = self._probing = 0
            return 0, f"K=0: no K pays even at alpha={OPTIMISTIC_ALPHA} with these costs"
        if best == 0 and cap >= 1:
            self.rounds_at_zero += 1
            if self.probe_k or self.rounds_at_zero >= self.probe_every:
                self.rounds_at_zero = 0
                k = min(cap, max(1, self.probe_k))
                self._probing = k
                return k, f"probe K={k} (alpha={self.alpha:.2f})"
        elif best > 0:
            self.rounds_at_zero = 0
            self.probe_k = 0
        self._probing = 0
        gain = self.rate(best) / self.rate(0)
        return best, f"alpha={self.alpha:.2f} K={best} est {gain:.2f}x of K=0"

    def observe(self, rec: RoundRecord) -> None:
        self.cost.observe(rec)
        if self._probing:
            self.probe_k = min(self.k_max, 2 * rec.proposed) if rec.proposed and rec.accepted == rec.proposed else 0
        if rec.proposed == 0:
            return
        self.accepted = self.decay * self.accepted + rec.accepted
        self.rejected = self.decay * self.rejected + (1 if rec.accepted < rec.proposed else 0)


class HeuristicController:
    """Hugging Face's rule: K += 2 after a fully accepted round, else K −= 1 (min 1)."""

    def __init__(self, k_init: int, k_max: int):
        self.k, self.k_max = k_init, k_max

    def choose(self, k_cap: int) -> tuple[int, str]:
        return min(self.k, k_cap), f"K={self.k} (+2/-1)"

    def observe(self, rec: RoundRecord) -> None:
        if rec.proposed == 0:
            return
        if rec.accepted == rec.proposed:
            self.k = min(self.k_max, self.k + 2)
        else:
            self.k = max(1, self.k - 1)
