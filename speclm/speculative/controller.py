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
speculation back within a few probes. A probe that fails doubles the gap to
the next (up to PROBE_BACKOFF · probe_every rounds), so on an unpredictable
workload the probes' cost shrinks as the evidence grows (docs/design.md
gives a measured case).

Per-position rule (a free proposer whose drafts carry per-token estimates,
e.g. suffix decoding): choose() lets the proposer draft K_max and
keep(draft) (choose_prefix(c_1..c_n)) keeps the prefix m in 0..n maximising
E(m) / (v(m+1) + o), E(m) = 1 + Σ_{j≤m} Π_{i≤j} ĉ_i, where ĉ is the estimate
after a `Calibration` learnt online from every round's outcome. v(b) is the
measured cost of every block size, so a cheap long block (v(16) < v(9) on
llama.cpp) is found; K = 0 when no prefix pays, with a one-token probe every
`probe_every` such rounds so that the calibration keeps learning (a fully
accepted probe is followed at once by one twice as long; failed ones back
off as above). An estimate counted
over few occurrences enters the calibration smoothed (count / (n + 1)): a
continuation seen once is a weak prior, and gets calibration cells apart from
one seen many times. A proposer that names each draft's source (the request's
own context, other requests' outputs) gets cells per source too. A proposer
that also passes the drafted tokens has every one calibrated against the token
the request then emitted (learn()), verified or not: a cell whose estimates
fell below what pays would otherwise never be verified, nor corrected, again.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from ..costs import CostModel, expected_emitted, expected_tokens, net_tokens, round_rate
from ..metrics import RoundRecord
from .proposers.base import Draft


class Controller:
    """What the loop asks of a controller each round, with the answers of a fixed K
    (the null controller every method without one gets).

    choose(k_cap) -> (K to draft, note); keep(draft, at) -> how many drafted tokens
    to verify (`at`: the context length the draft continues); observe(record)
    after the round; learn(context) whenever the context grew. A batching
    driver first tells it the rest of the step (share_step) and asks what the
    planned round should emit (expected_for)."""

    prefix_note: str | None = None  # why keep() kept what it kept (the trace shows it)
    prefix_expected: list[float] | None = None  # E[tokens] verifying m of the draft last kept, m = 0..len
    prices_prefixes = False  # keep() prices every prefix of a draft (prefix_expected): a step may re-cut it

    def choose(self, k_cap: int) -> tuple[int, str | None]:
        return k_cap, None

    def keep(self, draft: Draft, at: int) -> int:
        return len(draft)

    def share_step(self, blocks: dict[int, int], expected: float, seq: int, split: bool = False,
                   joint: bool = False) -> None:
        """The other sequences' blocks in the same forward (a fixed K ignores them)."""

    def recut(self, m: int) -> None:
        """The step verifies m tokens of the draft last kept instead (steps.even_blocks)."""

    def expected_for(self, n_drafted: int) -> float:
        """E[tokens emitted] by the round just planned with n_drafted tokens (a fixed K:
        a neutral guess of half its drafts)."""
        return 1.0 + 0.5 * n_drafted

    def observe(self, rec: RoundRecord) -> None:
        """The round's record, once it is complete."""

    def learn(self, context: list[int]) -> None:
        """The request's context so far (drafts given with tokens are calibrated against it)."""


OPTIMISTIC_ALPHA = 0.98
LOSING_MARGIN = 1.2  # a source whose drafts lost lately must promise this much of K = 0's rate
LEDGER_DECAY = 0.8  # per verified round of a source: its net gain remembers ~5 rounds
PROBE_BACKOFF = 4  # at most this many times probe_every rounds between failed probes


def match_group(match_len: int | None, source: str | None = None) -> int | tuple[str, int]:
    """Calibration group of an estimate made on a suffix match of this many tokens
    (0: no match length known; then 1, 2-3, 4-7, 8-15, 16-31, 32+), per source of
    the draft when one is named: a continuation of the request's own context and
    one from other requests' outputs are not equally reliable at the same count
    and match (docs/results.md#w13 shows how far apart they were)."""
    group = 0 if not match_len else min(match_len.bit_length(), 6)
    return group if source is None else (source, group)


@dataclass
class Calibration:
    """Maps a proposer's estimated acceptance probability to the observed one.

    Estimates fall in cells: a group (the length of the match the estimate was
    made on: a continuation seen once after a 1-token match and one seen once
    after a 16-token match are not equally reliable) and a bucket of the
    estimate (upper edges `edges`). Per cell, decayed sums of predictions and of
    outcomes; calibrated(c) = c + (Σ outcome − Σ predicted) / (n + prior_weight),
    clipped to [0, 1]: no observations leave c as is, many move it to the cell's
    observed rate. Beside it, per draft source, the ledger: a decayed sum of
    what its verified rounds gained over plain decoding, in tokens ((a + 1) −
    v(K + 1) / v(1) a round), which the goodput controller reads to stop betting
    on a source that has been losing (docs/design.md#the-loss-guard).
    Shareable by the requests of one LLM and proposer kind; thread-safe.
    """

    edges: tuple[float, ...] = (0.3, 0.5, 0.7, 0.8, 0.9, 0.97, 1.0)
    prior_weight: float = 4.0
    decay: float = 0.99  # per observation in a cell: ~100-observation memory
    cells: dict[tuple, list[float]] = field(default_factory=dict)  # (group, bucket) -> [seen, predicted, accepted]
    ledger: dict[str | None, float] = field(default_factory=dict)  # source -> decayed net tokens gained
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bucket(self, c: float) -> int:
        return min(bisect_left(self.edges, c), len(self.edges) - 1)

    def __call__(self, c: float, group: int | tuple[str, int] = 0) -> float:
        seen, predicted, accepted = self.cells.get((group, self.bucket(c)), (0.0, 0.0, 0.0))
        return min(1.0, max(0.0, c + (accepted - predicted) / (seen + self.prior_weight)))

    def record_net(self, source: str | None, net_tokens: float) -> None:
        """One verified round of a draft from `source`: tokens it emitted minus its cost in v(1)."""
        with self._lock:
            self.ledger[source] = LEDGER_DECAY * self.ledger.get(source, 0.0) + net_tokens

    def losing(self, source: str | None) -> bool:
        """Whether `source`'s recent verified rounds, together, cost more than they gained."""
        return self.ledger.get(source, 0.0) < 0.0

    def update(self, c: float, accepted: bool, group: int | tuple[str, int] = 0) -> None:
        """One verified position: estimate c (made in `group`), and whether it was accepted."""
        with self._lock:
            cell = self.cells.setdefault((group, self.bucket(c)), [0.0, 0.0, 0.0])
            cell[0] = self.decay * cell[0] + 1.0
            cell[1] = self.decay * cell[1] + c
            cell[2] = self.decay * cell[2] + float(accepted)


def draft_groups(n: int, match_len: int | None, source: str | None,
                 origins: tuple[tuple[str | None, int], ...] | None = None) -> list:
    """The calibration group of each of a draft's first n tokens: token j's estimate rests
    on a match of match_len + j tokens in `source`, or on its own origin's where given."""
    if origins is not None:
        return [match_group(m, src) for src, m in origins[:n]]
    return [match_group(match_len + j if match_len else None, source) for j in range(n)]


def smoothed_estimate(c: float, support: int) -> float:
    """A count-based estimate c = count / n, shrunk as if one more occurrence had
    disagreed: count / (n + 1). A continuation seen once (1/1) enters the
    calibration as 0.5, one seen in 9 of 9 as 0.9."""
    return c * support / (support + 1) if support > 0 else c


def matched_run(context: list[int], at: int, tokens: list[int]) -> int:
    """How many of a draft's tokens, continuing context[:at], the context went on to hold."""
    j, n = 0, len(context)
    while j < len(tokens) and at + j < n and context[at + j] == tokens[j]:
        j += 1
    return j


class GoodputController(Controller):
    """Per-request K choice; acceptance is per sequence, costs are shared."""

    def __init__(self, cost: CostModel, k_max: int, alpha_prior: float = 0.5,
                 prior_weight: float = 2.0, decay: float = 0.9, probe_every: int = 16,
                 calibration: Calibration | None = None, per_position: bool = False):
        self.cost, self.k_max = cost, k_max
        self.calibration = calibration if calibration is not None else Calibration()
        self.per_position = per_position  # True: drafts carry estimates, choose_prefix() cuts them
        self.shared_blocks: dict[int, int] = {}  # other sequences' blocks in the same forward (share_step)
        self.joint = False  # the step may re-cut every request's block together (share_step)
        self.shared_expected = 0.0
        self.step_ms: Callable[[int], float] = lambda b: cost.step({-1: b})  # ms of the next step given my block
        self.planned_expected = 1.0  # E[tokens] of the round last planned (for the step's other requests)
        self._predicted: list[tuple[float, int | tuple[str, int]]] = []  # (estimate, group) of verified positions
        self._source: tuple[str | None] | None = None  # the source of the draft last cut (choose_prefix)
        self._shadow: list[tuple[int, list[int], list]] = []  # (at, tokens, [(estimate, group)]) not yet learnt
        self.prefix_note: str | None = None
        self.decay, self.probe_every = decay, probe_every
        self.accepted = alpha_prior * prior_weight  # decayed pseudo-counts
        self.rejected = (1 - alpha_prior) * prior_weight
        self.rounds_at_zero = 0
        self.probe_gap = probe_every  # rounds at K = 0 before the next probe (doubles after a failed one)
        self.probe_k = 0  # > 0: the last probe was fully accepted; probe again with this K
        self._probing = 0  # K of the probe in flight (0: none)

    @property
    def prices_prefixes(self) -> bool:
        return self.per_position

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def share_step(self, blocks: dict[int, int], expected: float, seq: int, split: bool = False,
                   joint: bool = False) -> None:
        """The next round's forward, on sequence `seq`, also carries other sequences'
        blocks (blocks[seq'] tokens), expected to emit `expected` tokens, prompt rows of
        prefill chunks counted as tokens (a batching engine says so before each plan;
        {}, 0 alone). K is then chosen for the
        goodput of the whole step: (expected + E(K)) / step(blocks + {seq: K + 1}),
        so it falls to 0 once the batch is compute-bound, or when a block longer
        than the others would cost a pass of its own that its tokens do not pay for.
        split: the engine runs the step as the forwards CostModel.groups picks, so
        the step is priced that way (a drafted row can move where the split falls).
        joint: the step may then re-cut the blocks of all its requests together
        (steps.even_blocks), so a request drafts even where its own block would not pay."""
        self.shared_blocks, self.shared_expected, self.joint = dict(blocks), expected, joint
        self.step_ms = self.cost.pricer(self.shared_blocks, seq, split)

    def _step_rate(self, emitted: float, k: int) -> float:
        return round_rate(self.shared_expected + emitted, k, self.cost, self.step_ms(k + 1))

    def prefix_rate(self, emitted: float, m: int) -> float:
        """Tokens per ms of the step when verifying m tokens of a draft already made."""
        return round_rate(self.shared_expected + emitted, m, self.cost, self.step_ms(m + 1), drafted=True)

    def rate(self, k: int) -> float:
        """Expected emitted tokens per ms of the step when drafting k."""
        return self._step_rate(expected_emitted(self.alpha, k), k)

    def could_pay(self, cap: int) -> bool:
        """Would some K in 1..cap beat plain decoding at an optimistic acceptance?"""
        plain = self._step_rate(1.0, 0)
        return any(self._step_rate(expected_emitted(OPTIMISTIC_ALPHA, k), k) > plain for k in range(1, cap + 1))

    def expected_for(self, n_drafted: int) -> float:
        """E[tokens emitted] by the round just planned with n_drafted tokens."""
        if self.per_position:
            return self.planned_expected if n_drafted else 1.0
        return expected_emitted(self.alpha, n_drafted)

    def keep(self, draft: Draft, at: int) -> int:
        """The prefix of `draft` to verify: choose_prefix over its estimates (every
        drafted token calibrated later, learn()); a draft without estimates whole."""
        if not self.per_position or draft.confidence is None:
            return len(draft)
        return self.choose_prefix(draft.confidence, draft.match_len, draft.support, draft.source,
                                  tokens=draft.tokens, at=at, origins=draft.origins)

    def choose(self, k_cap: int) -> tuple[int, str]:
        cap = min(self.k_max, k_cap)
        self._predicted = []
        self.prefix_expected = None
        self.planned_expected = 1.0
        if self.per_position:
            if cap >= 1 and not self.joint and not self.could_pay(cap):
                return 0, f"K=0: no K pays even at alpha={OPTIMISTIC_ALPHA} with these costs"
            return cap, f"draft up to K={cap}; the prefix is chosen from the draft's estimates"
        best = max(range(cap + 1), key=self.rate)
        if best == 0 and cap >= 1 and not self.could_pay(cap):
            self.probe_k = self._probing = 0
            return 0, f"K=0: no K pays even at alpha={OPTIMISTIC_ALPHA} with these costs"
        if k := self._probe(best, cap):
            return k, f"probe K={k} (alpha={self.alpha:.2f})"
        gain = self.rate(best) / self.rate(0)
        return best, f"alpha={self.alpha:.2f} K={best} est {gain:.2f}x of K=0"

    def _probe(self, best: int, cap: int) -> int:
        """After choosing `best` of at most `cap`: the K of a probe due now (0: none).
        Counts rounds at K = 0; a probe runs every probe_gap of them (probe_every,
        doubled by each failed probe up to PROBE_BACKOFF times), and at once (twice
        as long) after a fully accepted one (probe_k, set by observe).
        In a shared forward a probe costs a pass of its own, so with n sequences
        in the step each probes every n · probe_gap rounds: the step as a whole
        still pays for about one probe every probe_gap steps."""
        self._probing = 0
        if best > 0:
            self.rounds_at_zero = self.probe_k = 0
            self.probe_gap = self.probe_every
        elif cap >= 1:
            self.rounds_at_zero += 1
            if self.probe_k or self.rounds_at_zero >= self.probe_gap * (1 + len(self.shared_blocks)):
                self.rounds_at_zero = 0
                self._probing = min(cap, max(1, self.probe_k))
        return self._probing

    def choose_prefix(self, confidence: list[float], match_len: int | None = None,
                      support: tuple[int, ...] | None = None, source: str | None = None,
                      tokens: list[int] | None = None, at: int | None = None,
                      origins: tuple[tuple[str | None, int], ...] | None = None) -> int:
        """How many of the drafted tokens to verify: the m in 0..len(confidence)
        (≤ k_max) maximising E(m) / (v(m+1) + o) under the calibrated estimates
        (the draft is already paid for). match_len: the suffix match the draft
        continues (token j's estimate rests on a match of match_len + j tokens).
        support: the occurrences each estimate was counted over; an estimate
        enters the calibration smoothed (smoothed_estimate), so thin evidence
        starts pessimistic and has cells of its own. source: where the draft came
        from ("own", "cache"); each source is calibrated in cells of its own.
        tokens, at: the drafted tokens and the context length they continue. With
        them every drafted token is calibrated, verified or not, once the context
        reaches its position (learn()); without them, the verified ones in observe().
        origins: per token (source, match length) of a draft that spans several
        sources; each token is calibrated in its own origin's cells."""
        conf = confidence[:self.k_max]
        if support is not None:
            conf = [smoothed_estimate(c, n) for c, n in zip(conf, support)]
        groups = draft_groups(len(conf), match_len, source, origins)
        cal = [self.calibration(c, g) for c, g in zip(conf, groups)]
        exp = expected_tokens(cal)
        rates = [self.prefix_rate(exp[m], m) for m in range(len(exp))]
        best = max(range(len(rates)), key=rates.__getitem__)
        note = f"K={best} of {len(cal)} drafted: E={exp[best]:.2f} tokens, est {rates[best] / rates[0]:.2f}x of K=0"
        if probe := self._probe(best, len(cal)):
            best, note = probe, f"probe K={probe} of {len(cal)} drafted (calibrated c1={cal[0]:.2f})"
        # the loss guard, for drafts whose tokens are calibrated verified or not (learn()): a vetoed
        # draft still teaches the calibration, so a source can earn its way back without probes
        learns = tokens is not None and at is not None
        if best and learns and self.calibration.losing(source) and rates[best] < LOSING_MARGIN * rates[0]:
            note = f"K=0: {source} drafts lost lately, and this one promises {rates[best] / rates[0]:.2f}x of K=0"
            best, self._probing = 0, 0
        self._source = (source,)
        if tokens is not None and at is not None:
            self._shadow.append((at, list(tokens[:len(conf)]), list(zip(conf, groups))))
            self._predicted = []
        else:
            self._predicted = list(zip(conf[:best], groups[:best]))
        self.prefix_note = note
        self.planned_expected = exp[best]
        self.prefix_expected = exp
        return best

    def recut(self, m: int) -> None:
        """The step verifies m tokens of the draft last cut (a joint choice over its
        requests, steps.even_blocks). Its gain belongs to the step, so the source's
        ledger, which prices a request's own cuts, leaves this round out."""
        self.planned_expected = self.prefix_expected[m] if self.prefix_expected else 1.0
        self.prefix_note = f"K={m}: the step's even block (E={self.planned_expected:.2f} tokens)"
        self._source, self._probing = None, 0

    def learn(self, context: list[int]) -> None:
        """Calibrate the drafts given to choose_prefix with tokens, against the
        tokens the request emitted after all. Token j of a draft is counted once
        tokens 1..j-1 matched and the context holds position j: it matches iff it
        was (or would have been) accepted, as the target emits a deterministic
        draft's token with the probability that it accepts it. Drafts that start
        beyond the end of the context (it was restarted shorter) are dropped."""
        n, keep = len(context), []
        for at, tokens, predicted in self._shadow:
            if at > n:
                continue
            j = matched_run(context, at, tokens)
            known = j if at + j >= n else min(j + 1, len(tokens))  # positions whose outcome is known
            for i, (c, group) in enumerate(predicted[:known]):
                self.calibration.update(c, i < j, group)
            if known == j < len(tokens):
                keep.append((at + j, tokens[j:], predicted[j:]))
        self._shadow = keep

    def observe(self, rec: RoundRecord) -> None:
        self.cost.observe(rec)
        # the verifier's a: a stop inside the round cuts delivered tokens, not acceptance
        a = getattr(rec, "verified", rec.accepted)
        if rec.proposed and self._source is not None:
            self.calibration.record_net(self._source[0],
                                        net_tokens(a + 1, self.step_ms(rec.proposed + 1), self.step_ms(1)))
        self._source = None
        seen = min(a + 1, rec.proposed, len(self._predicted))
        for j in range(seen):  # position j+1 was verified: accepted iff j < a
            c, group = self._predicted[j]
            self.calibration.update(c, j < a, group)
        self._predicted = []
        if self._probing:
            full = bool(rec.proposed) and a == rec.proposed
            self.probe_k = min(self.k_max, 2 * rec.proposed) if full else 0
            self.probe_gap = self.probe_every if full else min(2 * self.probe_gap,
                                                               PROBE_BACKOFF * self.probe_every)
        if rec.proposed == 0:
            return
        self.accepted = self.decay * self.accepted + a
        self.rejected = self.decay * self.rejected + (1 if a < rec.proposed else 0)


class HeuristicController(Controller):
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
