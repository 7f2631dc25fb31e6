"""Controller policies tried offline with `speclm bench replay --policy` against
method auto's (controller.GoodputController): each keeps auto's costs, probes
and per-step pricing and changes one thing about how a draft's prefix is
valued. What each kept on recorded runs is in docs/bench.md#replay.

`runlength`: from learnt run lengths.
The goodput controller (controller.py) prices a draft's prefix m with
E(m) = 1 + Σ_{j≤m} Π_{i≤j} ĉ_i, each ĉ_i a calibrated per-token estimate. A
copy, though, is right or wrong in runs: once an answer follows an earlier
text it tends to go on following it, so per-token estimates multiplied
together undervalue long blocks of a good match and the controller cuts them
short. This policy learns the run instead: for drafts with the same features
known at draft time (source, length of the match, whether it is the answer's
first draft, the first token's estimate), the survival S(j) = P(the first j
drafted tokens are all what the answer emitted), counted over every earlier
draft in that cell (verified or not: learn() sees what the request emitted).
The prefix kept is the m maximising (1 + Σ_{j≤m} S(j)) / (v(m + 1) + o) for
the step it joins; where a cell has too little evidence its survival falls
back to the goodput controller's product, so the policy starts as `auto` does.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from ..costs import CostModel
from .controller import Calibration, GoodputController, draft_groups, match_group, matched_run, smoothed_estimate
from .methods import COPY_K


def estimate_bucket(c: float) -> int:
    """A coarse bucket of the first token's estimate (0: < 0.5, 1: < 0.8, 2: < 0.95, 3: above)."""
    return (c >= 0.5) + (c >= 0.8) + (c >= 0.95)


@dataclass
class RunLengths:
    """Per cell, decayed counts of drafts whose first j tokens all matched (j = 1..K_max),
    and of drafts whose outcome is known up to j. Shareable by the requests of one scope."""

    k_max: int = COPY_K
    decay: float = 0.995  # per draft in a cell: ~200-draft memory
    min_evidence: float = 6.0  # drafts known at a position before its survival is trusted
    cells: dict[tuple, list[list[float]]] = field(default_factory=dict)  # cell -> [[matched_j], [known_j]]
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def survival(self, cell: tuple, fallback: list[float]) -> list[float]:
        """S(1..n) for a draft of n = len(fallback) tokens (fallback: the products of
        calibrated per-token estimates): learnt where the cell knows enough; beyond, the
        last learnt value continued by the fallback's own ratios S(j)/S(j-1); never
        increasing in j."""
        counts = self.cells.get(cell)
        out, prev, prev_fb = [], 1.0, 1.0
        for j, fb in enumerate(fallback):
            if counts is not None and counts[1][j] >= self.min_evidence:
                s = counts[0][j] / counts[1][j]
            else:
                s = prev * (fb / prev_fb if prev_fb > 0 else 0.0)
            prev, prev_fb = min(prev, s), fb
            out.append(prev)
        return out

    def update(self, cell: tuple, matched: int, known: int) -> None:
        """One draft of the cell: its first `matched` tokens matched the answer, and the
        outcome is known for its first `known` positions (matched ≤ known)."""
        with self._lock:
            counts = self.cells.setdefault(cell, [[0.0] * self.k_max, [0.0] * self.k_max])
            for j in range(self.k_max):
                counts[0][j] *= self.decay
                counts[1][j] *= self.decay
                if j < known:
                    counts[1][j] += 1.0
                    counts[0][j] += j < matched


class RunLengthController(GoodputController):
    """The goodput controller with the kept prefix chosen from learnt run lengths."""

    def __init__(self, cost: CostModel, k_max: int, calibration: Calibration | None = None,
                 runs: RunLengths | None = None, **kw):
        super().__init__(cost, k_max=k_max, calibration=calibration, per_position=True, **kw)
        self.runs = runs if runs is not None else RunLengths(k_max)
        self._drafts: list[tuple[int, list[int], tuple]] = []  # (at, tokens, cell) not yet learnt

    def choose_prefix(self, confidence: list[float], match_len: int | None = None,
                      support: tuple[int, ...] | None = None, source: str | None = None,
                      tokens: list[int] | None = None, at: int | None = None,
                      origins: tuple[tuple[str | None, int], ...] | None = None) -> int:
        conf = confidence[:self.k_max]
        if not conf or tokens is None or at is None:
            return super().choose_prefix(confidence, match_len, support, source, tokens, at, origins)
        smoothed = [smoothed_estimate(c, n) for c, n in zip(conf, support)] if support is not None else conf
        cell = (source, match_group(match_len), estimate_bucket(smoothed[0]))
        groups = draft_groups(len(conf), match_len, source, origins)
        product, fallback = 1.0, []
        for c, g in zip(smoothed, groups):
            product *= self.calibration(c, g)
            fallback.append(product)
        surv = self.runs.survival(cell, fallback)
        exp = [1.0]
        for s in surv:
            exp.append(exp[-1] + s)
        rates = [self.prefix_rate(exp[m], m) for m in range(len(exp))]
        best = max(range(len(rates)), key=rates.__getitem__)
        note = f"K={best} of {len(conf)} drafted: E={exp[best]:.2f} tokens (runs), est {rates[best] / rates[0]:.2f}x"
        if probe := self._probe(best, len(conf)):
            best, note = probe, f"probe K={probe} of {len(conf)} drafted"
        self._shadow.append((at, list(tokens[:len(conf)]), list(zip(smoothed, groups))))
        self._drafts.append((at, list(tokens[:len(conf)]), cell))
        self._predicted = []
        self.prefix_note = note
        self.planned_expected = exp[best]
        return best

    def learn(self, context: list[int]) -> None:
        super().learn(context)  # the per-token calibration still learns: it is the fallback
        n, keep = len(context), []
        for at, tokens, cell in self._drafts:
            if at > n:
                continue
            j = matched_run(context, at, tokens)
            if j == len(tokens) or at + j < n:  # the run's end is known
                self.runs.update(cell, j, min(j + 1, len(tokens)))
            else:
                keep.append((at, tokens, cell))
        self._drafts = keep


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


class RecentBias:
    """`recent`: a request's own bias on top of the shared calibration. The shared
    cells learn across every request of a scope, so after a copy-heavy stretch
    they stay optimistic on a request that copies little (and the reverse). This
    adds a per-request offset δ in logit space, ĉ' = σ(logit(ĉ) + δ), moved by
    lr · (outcome − ĉ') at every calibrated position; a request starts from the
    previous one's δ (where the scope's last answers ended). Updates reach the
    shared calibration unchanged."""

    def __init__(self, base: Calibration, delta: float = 0.0, lr: float = 0.1, bound: float = 4.0):
        self.base, self.delta, self.lr, self.bound = base, delta, lr, bound

    def __call__(self, c: float, group: int | tuple[str, int] = 0) -> float:
        return 1.0 / (1.0 + math.exp(-(_logit(self.base(c, group)) + self.delta)))

    def update(self, c: float, accepted: bool, group: int | tuple[str, int] = 0) -> None:
        self.delta += self.lr * (float(accepted) - self(c, group))
        self.delta = max(-self.bound, min(self.bound, self.delta))
        self.base.update(c, accepted, group)

    def record_net(self, source: str | None, net_tokens: float) -> None:
        self.base.record_net(source, net_tokens)

    def losing(self, source: str | None) -> bool:
        return self.base.losing(source)


class KnownCells:
    """`known-cells` (a bound for analysis, not a controller): every calibration cell
    answers with the acceptance rate a whole replay observed in it, counted in
    advance (`learnt`, a Calibration with decay 1), and learns nothing more; no
    loss guard. What auto's rule would keep if its calibration were exact in its
    own cells (speculative/replay.known_cells)."""

    def __init__(self, learnt: Calibration):
        self.learnt = learnt

    def __call__(self, c: float, group: int | tuple[str, int] = 0) -> float:
        seen, _, accepted = self.learnt.cells.get((group, self.learnt.bucket(c)), (0.0, 0.0, 0.0))
        return accepted / seen if seen else c

    def update(self, c: float, accepted: bool, group: int | tuple[str, int] = 0) -> None:
        """Known in advance: nothing to learn."""

    def record_net(self, source: str | None, net_tokens: float) -> None:
        """No loss guard."""

    def losing(self, source: str | None) -> bool:
        return False
