"""Costs: the one way speclm times forwards and prices rounds (docs/design.md#costs).

v(b) is the time of one target forward over b rows. It is timed here and only
here (`time_blocks`, `time_curve`, `calibrate`), with the context length and
the statistic named at each call, or read from a run's own forwards
(`observed_curve`); a round drafting K tokens costs
c·K + v(K+1) + o (`round_cost`) and emits E(K) tokens in expectation
(`expected_emitted`, or `expected_tokens` from per-token estimates), so a
round yields `round_rate` tokens per ms. The live forwards, drafts and rounds
are timed on `clock_ms`; every running cost averages with `ewma`. The
controller, the kernel probe, the bench's ceiling, sweep and projection and
`speclm models compare` all read these.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .metrics import RoundRecord


class TimedBackend(Protocol):
    """What timing needs of a backend (speclm.backends.base.Backend has it all;
    costs sit below the backends, so they name the methods instead of importing it)."""

    n_ctx: int

    def new_sequence(self) -> int: ...
    def prefill(self, seq: int, tokens: list[int]): ...
    def score(self, seq: int, tokens: list[int]): ...
    def rollback(self, seq: int, n_tokens: int) -> None: ...
    def free(self, seq: int) -> None: ...
    def pass_rows(self, blocks: dict[int, int]) -> list[int]: ...
    def batch_order(self, seqs: list[int]) -> list[int]: ...

FILLER = 1  # the token a context of n filler tokens is made of
EWMA_WEIGHT = 0.2  # the weight of a new observation in every running cost (CostModel, the SSD speculator)


# ---- timing --------------------------------------------------------------------------
def clock_ms() -> float:
    """Now, in ms, on the monotonic clock that times every forward, draft and round
    (the difference of two readings is a duration; a reading alone means nothing)."""
    return time.perf_counter() * 1000.0


def ewma(old: float | None, new: float, weight: float = EWMA_WEIGHT) -> float:
    """A running cost after one more observation `new` (the observation itself when none yet)."""
    return new if old is None else old + weight * (new - old)


def time_blocks(backends: Sequence[TimedBackend], context: list[int], block: list[int], sizes: Sequence[int],
                repeats: int, say: Callable[[str], None] | None = None) -> list[dict[int, list[float]]]:
    """ms to score block[:b] after `context`, per backend and size b, `repeats` times,
    interleaved across the backends (round-robin) so machine noise hits all alike.
    One warm-up forward first, and an untimed one at each repeat (the first forward
    after another model ran is slow)."""
    seqs = []
    try:
        for be in backends:
            seq = be.new_sequence()
            seqs.append(seq)
            be.prefill(seq, context)
            be.score(seq, block[:1])  # warm-up
            be.rollback(seq, len(context))
        times: list[dict[int, list[float]]] = [{b: [] for b in sizes} for _ in backends]
        for rep in range(repeats):
            for i, (be, seq) in enumerate(zip(backends, seqs)):
                be.score(seq, block[:1])
                be.rollback(seq, len(context))
                for b in sizes:
                    t0 = clock_ms()
                    be.score(seq, block[:b])
                    times[i][b].append(clock_ms() - t0)
                    be.rollback(seq, len(context))
            if say:
                say(f"v(k) repeat {rep + 1}/{repeats} done")
    finally:
        for be, seq in zip(backends, seqs):
            be.free(seq)
    return times


def time_curve(backend: TimedBackend, sizes: Sequence[int], context: list[int] | int = 64, repeats: int = 2,
               statistic: Callable[[list[float]], float] = min) -> dict[int, float]:
    """v(b) in ms for each size b: the `statistic` of `repeats` timings after `context`
    (token ids, or that many filler tokens; trimmed so context and block fit)."""
    sizes = sorted(set(sizes))
    tokens = [FILLER] * context if isinstance(context, int) else list(context)
    tokens = tokens[-max(1, backend.n_ctx - sizes[-1] - 1):] or [FILLER]
    block = (tokens * (1 + sizes[-1] // len(tokens)))[:sizes[-1]]
    times = time_blocks([backend], tokens, block, sizes, repeats)[0]
    return {b: statistic(ts) for b, ts in times.items()}


def time_prefill(backend: TimedBackend, tokens: int, repeats: int = 2,
                 statistic: Callable[[list[float]], float] = min) -> float:
    """ms to prefill a prompt of `tokens` filler tokens into a fresh sequence (the backend's own
    chunking): the `statistic` of `repeats` timings."""
    seq = backend.new_sequence()
    times = []
    try:
        for _ in range(repeats):
            t0 = clock_ms()
            backend.prefill(seq, [FILLER] * tokens)
            times.append(clock_ms() - t0)
            backend.rollback(seq, 0)
    finally:
        backend.free(seq)
    return statistic(times)


SPLIT_GAIN = 0.9  # a step runs as several forwards only when priced >= 10 % cheaper (the curve is noisy)


@dataclass
class CostModel:
    """Measured costs of one (target, proposer) pair, shared by all requests.

    verify_ms[b]: EWMA of the ms of one forward pass over b rows (b = K + 1 alone).
    Unmeasured sizes are interpolated linearly between the nearest measured ones;
    beyond the largest, in proportion to it.
    A forward shared by several requests costs the sum of the passes the backend
    splits it into (`passes`, the target's `Backend.pass_rows`). A batching engine
    may run a step as a few smaller forwards where the curve prices them cheaper
    (`groups`); `pricer` prices one sequence's block in such a step.
    """

    verify_ms: dict[int, float] = field(default_factory=dict)
    draft_ms_per_token: float = 0.0
    other_ms: float = 0.5
    weight: float = EWMA_WEIGHT
    passes: Callable[[dict[int, int]], list[int]] | None = None  # None: one pass over every row
    order: Callable[[list[int]], list[int]] | None = None  # the backend's batch order (None: as given)

    def copy(self) -> CostModel:
        """An independent copy (its own curve to learn), sharing the backend's callables."""
        return dataclasses.replace(self, verify_ms=dict(self.verify_ms))

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
        if lower or len(sizes) == 1:
            # Beyond the curve a row costs what the largest block's rows cost on average (the
            # forward is compute-bound there). The slope of the last two points would carry
            # their noise hundreds of rows out: v(16) = 384 and v(17) = 450 ms would price a
            # 255-row prefill chunk at 16.2 s (measured: 6.9 s), and a drafted token beside it,
            # which shortens that chunk's own pass, would look free.
            top = sizes[-1] if lower else sizes[0]
            return self.verify_ms[top] * block / top
        a, b = sizes[0], sizes[1]
        slope = (self.verify_ms[b] - self.verify_ms[a]) / (b - a)
        return max(1e-3, self.verify_ms[a] + slope * (block - a))

    def step(self, blocks: dict[int, int]) -> float:
        """ms of one forward scoring blocks[seq] tokens of each sequence."""
        rows = self.passes(blocks) if self.passes else [sum(blocks.values())]
        return sum(self.verify(r) for r in rows)

    def groups(self, blocks: dict[int, int]) -> list[list[int]]:
        """The sequences of each forward a step over `blocks` should run as: one
        forward, unless 2–4 forwards, each a contiguous run of the batch order with
        about equal rows, are priced at least SPLIT_GAIN cheaper. The curve need not
        be convex: on a Zen 3 eight one-token blocks cost 314 ms as one forward and
        254 ms as two forwards of four."""
        seqs = [s for s in (self.order(list(blocks)) if self.order else blocks) if blocks[s]]
        best, best_ms = [seqs], self.step(blocks)
        total = sum(blocks[s] for s in seqs)
        for n in range(2, min(4, len(seqs)) + 1):
            groups: list[list[int]] = [[]]
            for s in seqs:
                if groups[-1] and len(groups) < n and sum(blocks[x] for x in groups[-1]) >= total / n:
                    groups.append([])
                groups[-1].append(s)
            ms = sum(self.step({s: blocks[s] for s in g}) for g in groups)
            if len(groups) == n and ms < SPLIT_GAIN * best_ms:
                best, best_ms = groups, ms
        return best

    def step_as_run(self, blocks: dict[int, int]) -> float:
        """ms of a step over `blocks` as a batching engine runs it: one forward, or the
        forwards `groups` splits it into."""
        return sum(self.step({s: blocks[s] for s in g}) for g in self.groups(blocks))

    def observe(self, rec: RoundRecord) -> None:
        rows = rec.batch_passes or [rec.proposed + 1]
        if len(rows) == 1 and not rec.prompt_rows:  # (several passes, or a prompt's rows: not v(rows))
            self.verify_ms[rows[0]] = ewma(self.verify_ms.get(rows[0]), rec.verify_ms, self.weight)
        if rec.proposed:
            self.draft_ms_per_token = ewma(self.draft_ms_per_token, rec.draft_ms / rec.proposed, self.weight)
        self.other_ms = ewma(self.other_ms, rec.other_ms, self.weight)

    def pricer(self, others: dict[int, int], seq: int, split: bool = False) -> Callable[[int], float]:
        """ms of the step as a function of the block b of sequence `seq` when the other
        sequences' blocks (`others`) ride in the same step, remembered per b (a
        controller prices up to K_max + 1 blocks every round). With split, the step
        runs either as one forward or as `groups` splits it with seq's block at one
        row, seq's own group then holding b rows; re-grouping for every b would
        cost ~40 ms of Python a step at 16 requests (measured), a tenth of the step."""
        memo: dict[int, float] = {}
        groups = self.groups({**others, seq: 1}) if split and others else None
        mine = next((g for g in groups if seq in g), None) if groups and len(groups) > 1 else None
        fixed = sum(self.step({s: others[s] for s in g}) for g in groups if g is not mine) if mine else 0.0

        def price(b: int) -> float:
            if b not in memo:
                one = self.step({**others, seq: b})
                if mine is not None:
                    parts = fixed + self.step({s: (b if s == seq else others[s]) for s in mine})
                    one = parts if parts < SPLIT_GAIN * one else one
                memo[b] = one
            return memo[b]
        return price


TIMED_K = 16  # the largest K whose block (K + 1 rows) calibrate() times: longer blocks are priced by extrapolation


def calibrate(target: TimedBackend, draft: TimedBackend | None, max_block: int = TIMED_K + 1, repeats: int = 2,
              blocks: Sequence[int] | None = None, context: int = 64,
              statistic: Callable[[list[float]], float] = min,
              known: dict[int, float] | None = None) -> CostModel:
    """A CostModel seeded by timing the target's blocks of 1..max_block tokens (or the
    sizes in `blocks`) after `context` filler tokens, and the draft's single steps.
    known: the target's v(b), already timed this way on this machine (the kernel
    probe's curve): then only the draft is timed, and the sizes between the known
    ones are interpolated (CostModel.verify) until the requests' own forwards refine them."""
    cost = CostModel(passes=target.pass_rows, order=target.batch_order)
    sizes = list(blocks) if blocks else list(range(1, max(1, min(max_block, target.n_ctx // 2)) + 1))
    cost.verify_ms = dict(known) if known else time_curve(target, sizes, context, repeats, statistic)
    if draft is not None:
        cost.draft_ms_per_token = time_curve(draft, [1], context, repeats=4)[1]
    return cost


def round_cost(k: int, draft_ms_per_token: float, verify_ms: float, other_ms: float) -> float:
    """ms of a round drafting k tokens whose forward costs verify_ms: c·K + v(K+1) + o."""
    return draft_ms_per_token * k + verify_ms + other_ms


def round_rate(emitted: float, k: int, cost: CostModel, verify_ms: float | None = None,
               drafted: bool = False) -> float:
    """Tokens per ms of a round that emits `emitted` tokens from a block of k drafted
    tokens: emitted / (c·k + v(k+1) + o). verify_ms: what the round's forward costs
    where it is shared or split (default cost.verify(k + 1)); drafted: the draft is
    already paid for (a prefix cut from it costs no c)."""
    v = cost.verify(k + 1) if verify_ms is None else verify_ms
    return emitted / round_cost(k, 0.0 if drafted else cost.draft_ms_per_token, v, cost.other_ms)


def best_rate(cost: CostModel, alpha: float, k_max: int) -> float:
    """The best round_rate over K = 0..k_max at i.i.d. acceptance alpha."""
    return max(round_rate(expected_emitted(alpha, k), k, cost) for k in range(k_max + 1))


def net_tokens(emitted: int, verify_ms: float, plain_ms: float) -> float:
    """What a verified round gained over plain decoding, in tokens: it emitted `emitted`
    for a forward of verify_ms that plain decoding would have spent on verify_ms / plain_ms."""
    return emitted - verify_ms / plain_ms


def expected_emitted(alpha: float, k: int) -> float:
    """E[tokens per round] for i.i.d. acceptance alpha and K = k (docs/design.md#metrics)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_tokens(confidence: list[float]) -> list[float]:
    """E(m) for m = 0..n: 1 + Σ_{j≤m} Π_{i≤j} c_i (conditional acceptance c_i)."""
    out, prob = [1.0], 1.0
    for c in confidence:
        prob *= c
        out.append(out[-1] + prob)
    return out


MIN_FORWARDS = 8  # a block size's observed median stands in for its timed v(b) from this many forwards


def observed_curve(timed: dict[int, float], forwards: Iterable[tuple[int, float]]
                   ) -> tuple[dict[int, float], dict[int, int]]:
    """The curve a run's own forwards measured, (v(b) in ms, forwards counted per b).
    forwards: (rows, ms) of single-pass forwards, at the contexts and moments the requests
    ran them. A size run at least MIN_FORWARDS times is priced at its median; any other size
    at its timed v(b) times the observed/timed ratio of the nearest size that was (the
    smaller on a tie), or as timed when none was: a run that ran one size often keeps the
    timed curve's shape. A curve timed in one sitting can miss the run's costs by a slow
    minute (docs/bench.md records by how much)."""
    seen: dict[int, list[float]] = {}
    for rows, ms in forwards:
        seen.setdefault(rows, []).append(ms)
    counts = {b: len(ms) for b, ms in sorted(seen.items())}
    known = {b: statistics.median(ms) for b, ms in seen.items() if len(ms) >= MIN_FORWARDS and b in timed}
    if not known:
        return dict(timed), counts
    curve = {}
    for b, ms in timed.items():
        near = min(known, key=lambda s: (abs(s - b), s))
        curve[b] = known[b] if b in known else ms * known[near] / timed[near]
    return curve, counts


def cost_ratios(curve: dict[int, float], k_max: int) -> list[float]:
    """v(b) / v(1) for b = 0..k_max + 1 (index b; index 0 unused), sizes not timed
    priced as the controller prices them (CostModel.verify)."""
    if curve.get(1, 0) <= 0:
        raise ValueError("the cost curve needs v(1) > 0")
    cost = CostModel(verify_ms=dict(curve))
    return [0.0] + [cost.verify(b) / curve[1] for b in range(1, k_max + 2)]
