"""Replay a run's greedy outputs through a controller, without the model.

A greedy run fixes what the target emits for every request, and suffix
drafting is deterministic, so the rounds any controller would have run on that
run can be replayed exactly: the ordinary loop and driver, the real suffix
drafter with one cache filled in run order (as the LLM's is), the real
controller with one calibration shared by every request (as the LLM's is),
over a RecordedBackend that emits the recorded outputs. Each round is priced
with the run's measured v(b) in units of v(1), so the result is the
decode-only speedup the controller would have reached there, the same measure
as the bench's copy ceiling (both are output tokens over Σ v(K + 1) / v(1)):
the share of the ceiling's gain a controller keeps is
(speedup − 1) / (ceiling − 1). docs/bench.md describes the command.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..backends.recorded import RecordedBackend
from ..costs import CostModel, cost_ratios
from ..sampling import SamplingParams
from .controller import Calibration, Controller, GoodputController
from .methods import COPY_K
from .proposers.suffix import SuffixProposer
from .policies import KnownCells, RecentBias, RunLengths, RunLengthController
from .proposers.suffix_index import SuffixCache, SuffixConfig
from .steps import generate


@dataclass(frozen=True)
class Stream:
    """One request of a greedy run: its prompt and what plain decoding emitted, in run order."""

    category: str
    prompt: list[int]
    output: list[int]
    max_new_tokens: int
    prediction: list[int] | None = None  # the client's expected output, where the prompt carried one


@dataclass
class Replayed:
    """What a controller would have done over one category's streams."""

    category: str
    tokens: int = 0  # output tokens
    cost: float = 0.0  # Σ v(K + 1) / v(1) over the rounds
    rounds: int = 0
    verified: int = 0  # drafted tokens kept for verification
    accepted: int = 0
    ks: list[int] | None = None  # every round's verified K, in order (for tests)

    @property
    def speedup(self) -> float:
        """Decode-only speedup over plain decoding (one v(1) a token)."""
        return self.tokens / self.cost if self.cost else 1.0

    def kept_share(self, ceiling: float) -> float | None:
        """The share of the ceiling's gain this keeps (None where the ceiling offers none)."""
        return (self.speedup - 1) / (ceiling - 1) if ceiling > 1 else None


# A policy builds one request's controller from the run's costs, the calibration every
# request shares, K_max, and a dict every request of the replay shares (what else the
# policy learns across requests, as an LLM keeps it per scope).
Policy = Callable[[CostModel, Calibration, int, dict], Controller]


def auto_policy(cost: CostModel, calibration: Calibration, k_max: int, shared: dict) -> Controller:
    """Method auto's controller, as the LLM builds it for suffix drafting."""
    return GoodputController(cost, k_max=k_max, calibration=calibration, per_position=True)


def runlength_policy(cost: CostModel, calibration: Calibration, k_max: int, shared: dict) -> Controller:
    """The goodput controller keeping the prefix that learnt run lengths favour (policies.py)."""
    return RunLengthController(cost, k_max=k_max, calibration=calibration,
                               runs=shared.setdefault("runs", RunLengths(k_max)))


def recent_policy(cost: CostModel, calibration: Calibration, k_max: int, shared: dict) -> Controller:
    """The goodput controller with a per-request bias on the shared calibration, each
    request starting from the last one's (policies.py)."""
    last = shared.get("recent")
    shared["recent"] = bias = RecentBias(calibration, last.delta if last is not None else 0.0)
    return GoodputController(cost, k_max=k_max, calibration=bias, per_position=True)


POLICIES: dict[str, Policy] = {"auto": auto_policy, "runlength": runlength_policy, "recent": recent_policy}  # for --policy


def replay(streams: Sequence[Stream], curves: dict[str, dict[int, float]], policy: Policy = auto_policy,
           k_max: int = COPY_K, suffix: SuffixConfig | None = None, cache_tokens: int = 100_000,
           keep_ks: bool = False, calibration: Calibration | None = None) -> list[Replayed]:
    """One Replayed per category (in run order). curves: category -> v(b) in ms, the
    costs the controller sees (fixed: it learns acceptance, not timing, here).
    calibration: the one every request shares (default: a fresh one)."""
    ids = sorted({t for s in streams for t in (*s.prompt, *s.output)})
    compact = {t: i for i, t in enumerate(ids)}  # equal ids stay equal: drafts and estimates are unchanged
    backend = RecordedBackend(len(ids) + 1, eos_id=len(ids))
    cache = SuffixCache(cache_tokens) if cache_tokens else None
    calibration, shared = (calibration if calibration is not None else Calibration()), {}
    out: dict[str, Replayed] = {}
    for s in streams:
        row = out.setdefault(s.category, Replayed(s.category, ks=[] if keep_ks else None))
        cost = CostModel(verify_ms=dict(curves[s.category]), weight=0.0)
        ratio = cost_ratios(curves[s.category], k_max)
        prompt, output = [compact[t] for t in s.prompt], [compact[t] for t in s.output]
        backend.expect(prompt, output)
        result = generate(backend, SuffixProposer(cache, suffix), prompt,
                          SamplingParams(temperature=0.0, max_new_tokens=s.max_new_tokens), k_max,
                          controller=policy(cost, calibration, k_max, shared))
        if result.token_ids != output:
            at = next((i for i, (a, b) in enumerate(zip(result.token_ids, output)) if a != b),
                      min(len(result.token_ids), len(output)))
            raise RuntimeError(f"the replay of a {s.category} request left its recording at token {at}")
        row.tokens += len(output)
        row.rounds += len(result.rounds)
        for r in result.rounds:
            row.cost += ratio[min(r.proposed, k_max) + 1]
            row.verified += r.proposed
            row.accepted += r.accepted
            if row.ks is not None:
                row.ks.append(r.proposed)
    return list(out.values())


def known_cells(streams: Sequence[Stream], curves: dict[str, dict[int, float]], k_max: int = COPY_K,
                suffix: SuffixConfig | None = None) -> list[Replayed]:
    """`--policy known-cells`, a bound: auto's controller with every calibration cell set in
    advance to the acceptance rate a first replay of auto observed in it over the whole run
    (policies.KnownCells). A controller of auto's kind, with these features, keeps about this
    much at best; what the ceiling holds beyond it takes knowing more than the cells do."""
    counted = Calibration(decay=1.0)
    replay(streams, curves, auto_policy, k_max, suffix, calibration=counted)
    known = KnownCells(counted)
    return replay(streams, curves, lambda cost, _, k, __: GoodputController(cost, k_max=k, calibration=known,
                                                                             per_position=True), k_max, suffix)


BOUNDS = {"known-cells": known_cells}  # for --policy: analyses that read the run's outcomes in advance
