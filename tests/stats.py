"""Exact target distributions on the toy backend and the sample-size bounds
of the losslessness tests: a total-variation bound on the joint distribution
of a few tokens (`empirical_check`), and the conditional harness
(`check_conditionals`) that tests every conditional of a longer window."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from speclm.backends.toy import ToyBackend
from speclm.sampling import SamplingParams, target_probs


def exact_distribution(target: ToyBackend, prompt: list[int], params: SamplingParams,
                       n_tokens: int) -> dict[tuple[int, ...], float]:
    """P(first n_tokens generated = s) for every s, by enumeration."""
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(target.vocab_size), repeat=n_tokens):
        prob, ctx = 1.0, list(prompt)
        for tok in seq:
            prob *= target_probs(target.logits_for(ctx), params)[tok]
            if prob == 0.0:
                break
            ctx.append(tok)
        if prob > 0:
            out[seq] = prob
    return out


def tv_bound(n_samples: int, n_outcomes: int, delta: float = 1e-6) -> float:
    """A total-variation radius that the empirical distribution of n i.i.d.
    samples exceeds with probability < delta (Bretagnolle–Huber–Carol:
    P(TV >= t) <= 2^M exp(-2 n t^2), M outcomes)."""
    return math.sqrt((n_outcomes * math.log(2) + math.log(1 / delta)) / (2 * n_samples))


def total_variation(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    counts = Counter(samples)
    n = len(samples)
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(s, 0) / n - exact.get(s, 0.0)) for s in keys)


def support_size(exact: dict) -> int:
    return max(1, len(exact))


def empirical_check(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> tuple[float, float]:
    """(observed TV, allowed bound). Outcomes outside the exact support must never occur."""
    impossible = [s for s in samples if s not in exact]
    assert not impossible, f"sampled sequences the target gives zero probability: {impossible[:3]}"
    return total_variation(samples, exact), tv_bound(len(samples), support_size(exact))


def first_tokens(result_ids: list[int], n: int) -> tuple[int, ...]:
    return tuple(result_ids[:n])


def np_seed_sequence(base: int, count: int) -> list[int]:
    return [int(x) for x in np.random.SeedSequence(base).generate_state(count)]


# ---- the conditional harness: every conditional of the first T tokens ---------------
DELTA = 1e-6  # failure probability of one check under a correct implementation
N_MIN = 10  # a conditional seen fewer times adds more to D_t than it can reveal
LAMBDAS = tuple(i / 10 for i in range(1, 10))


@dataclass
class DepthTest:
    """The pooled likelihood-ratio test of the conditionals at one depth."""

    depth: int  # 1-based position of the token whose conditionals are tested
    conditionals: int  # prefixes with n_s >= N_MIN
    statistic: float  # S_t = Σ n_s KL(p̂_s ‖ p_s)
    dof: int  # D_t = Σ (k_s − 1)
    threshold: float  # exceeded with probability < δ' under the target

    @property
    def exceeded(self) -> bool:
        return self.statistic >= self.threshold


@dataclass
class Verdict:
    """The harness's answer for one sample of generations."""

    n_samples: int
    depths: list[DepthTest]
    impossible: list[str]  # descriptions of outcomes the target can never produce

    @property
    def lossless(self) -> bool:
        return not self.impossible and not any(d.exceeded for d in self.depths)

    @property
    def worst_ratio(self) -> float:
        """max_t S_t / threshold_t (≥ 1: a depth failed)."""
        return max((d.statistic / d.threshold for d in self.depths), default=0.0)

    def describe(self) -> str:
        rows = [f"depth {d.depth}: S={d.statistic:.1f} D={d.dof} over {d.conditionals} conditionals, "
                f"threshold {d.threshold:.1f}{'  EXCEEDED' if d.exceeded else ''}" for d in self.depths]
        return "\n".join([f"{self.n_samples} samples", *rows, *self.impossible[:3]])


def pooled_threshold(dof: int, delta: float) -> float:
    """min over the λ grid of (D·ln(1/(1−λ)) + ln(1/δ)) / λ (see above)."""
    return min((dof * math.log(1 / (1 - lam)) + math.log(1 / delta)) / lam for lam in LAMBDAS)


def kl_statistic(counts: Counter, p: np.ndarray) -> float:
    """n·KL(p̂ ‖ p) for the observed counts of next tokens."""
    n = sum(counts.values())
    return sum(c * math.log(c / (n * p[tok])) for tok, c in counts.items())


def check_conditionals(samples: list[tuple[int, ...]], n_tokens: int,
                       next_probs: Callable[[tuple[int, ...]], np.ndarray],
                       terminal: Callable[[tuple[int, ...]], bool],
                       delta: float = DELTA) -> Verdict:
    """Test every conditional of the first n_tokens tokens against the target.

    next_probs(prefix): the target's processed next-token distribution after
    prefix (EOS included). terminal(prefix): the target stops after prefix
    (EOS drawn, or a stop string completed). A sample shorter than n_tokens
    must end at a terminal prefix; none may continue past one; no sampled
    token may have target probability 0.

    Statistic. A sequence y_1..y_T has the target's law iff, for every depth t
    and prefix s = y_1..y_{t-1}, the next token follows the target's
    conditional p_s. Under that hypothesis, given all samples' first t-1
    tokens, the n_s next tokens after each prefix s are independent draws
    from p_s. Per depth t the likelihood-ratio statistics of every conditional
    seen at least N_MIN times are pooled: S_t = Σ_s n_s·KL(p̂_s ‖ p_s)
    (2·S_t is the G-test's chi-square statistic), D_t = Σ_s (k_s − 1) with
    k_s = |support of p_s|.

    Bound (finite-sample, no asymptotics). Agrawal (2020, "Finite-sample
    concentration of the multinomial in relative entropy", arXiv 1904.02291):
    E[exp(λ·n·KL(p̂_n ‖ p))] ≤ (1 − λ)^−(k−1) for λ ∈ [0, 1). The pooled
    conditionals are independent given the earlier tokens, and which of them
    enter (n_s ≥ N_MIN) is decided by the earlier tokens alone, so
    E[exp(λ·S_t − D_t·ln(1/(1−λ)))] ≤ 1 and, by Markov,
        P( S_t ≥ (D_t·ln(1/(1−λ)) + ln(1/δ')) / λ ) ≤ δ'.
    The threshold is the minimum over the fixed grid LAMBDAS; a union bound
    over the grid and the T depths sets δ' = δ / (T·|LAMBDAS|). So a correct
    implementation fails with probability < delta (DELTA = 1e-6 per check),
    whatever the sample size; the sample size sets the power. Pooling per
    depth catches a bug concentrated in one conditional (depth 1 holds every
    sample) as well as one spread thin (a wrong bonus token lives at depth
    K + 1, over up to V^K prefixes).
    """
    by_prefix: dict[tuple[int, ...], Counter] = {}
    impossible: list[str] = []
    for y in samples:
        for t in range(len(y)):
            if terminal(y[:t]):
                impossible.append(f"{y}: continues after the terminal prefix {y[:t]}")
                break
            by_prefix.setdefault(y[:t], Counter())[y[t]] += 1
        if len(y) < n_tokens and not terminal(y):
            impossible.append(f"{y}: ended after {len(y)} tokens without EOS or a stop string")
    depths = []
    per_depth = delta / (n_tokens * len(LAMBDAS))
    for depth in range(1, n_tokens + 1):
        stat, dof, used = 0.0, 0, 0
        for prefix, counts in by_prefix.items():
            if len(prefix) != depth - 1:
                continue
            p = next_probs(prefix)
            zero = [tok for tok in counts if p[tok] <= 0.0]
            if zero:
                impossible.append(f"token(s) {zero} after {prefix}: target probability 0")
                continue
            if sum(counts.values()) < N_MIN:
                continue
            stat += kl_statistic(counts, p)
            dof += int(np.count_nonzero(p)) - 1
            used += 1
        depths.append(DepthTest(depth, used, stat, dof, pooled_threshold(dof, per_depth)))
    return Verdict(len(samples), depths, impossible)
