"""`speclm bench replay RUN_DIR`: a recorded run's greedy outputs replayed through
controller policies at the run's own cost curves, without the model
(speculative/replay.py), beside the run's copy ceiling: per category, the
decode-only speedup each policy would have reached and the share of the
ceiling's gain it keeps. docs/bench.md#replay.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ...errors import InvalidRequestError
from ...speculative.proposers.suffix_index import SuffixConfig
from ...speculative.replay import BOUNDS, POLICIES, Stream, replay
from .ceiling import best_ceiling, drafter_ceiling, observed_curves, read_rounds


def load_run(run_dir: Path) -> tuple[dict[str, list[Stream]], list[dict]]:
    """(streams per target, the run's copy-ceiling rows) of a bench output directory."""
    streams_file, summary_file = run_dir / "streams.jsonl", run_dir / "summary.json"
    if not streams_file.is_file() or not summary_file.is_file():
        raise InvalidRequestError(f"{run_dir} holds no replayable run: it needs streams.jsonl and summary.json "
                                  "from a greedy `speclm bench` run with a suffix-drafting method (auto, sd-suffix)")
    by_target: dict[str, list[Stream]] = {}
    for line in streams_file.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        target = d.pop("target_name")
        by_target.setdefault(target, []).append(Stream(**d))
    return by_target, json.loads(summary_file.read_text(encoding="utf-8")).get("copy_ceiling", [])


COSTS = {"recorded": "as the run's ceiling was", "timed": "timed after the requests",
         "observed": "the requests' own forwards, from rounds.jsonl"}  # the curves to price at: --costs


def replay_run(run_dir: Path, policies: list[str], rematch: bool | None = None, costs: str = "recorded") -> list[dict]:
    """One row per target, category and policy: speedup, kept share of the ceiling, rounds.
    rematch: replay with the suffix drafter's rematch set so (None: as the run drafted); the
    ceiling is then that drafter's, computed from the run's streams. costs: the curve to price
    at, `recorded` (as the run's ceiling was), `timed` (the curve timed after the requests) or
    `observed` (the requests' own forwards, from rounds.jsonl: ceiling.observed_curves); the
    ceilings are then recomputed at that curve."""
    unknown = [p for p in policies if p not in POLICIES and p not in BOUNDS]
    if unknown:
        raise InvalidRequestError(f"unknown policy {', '.join(unknown)}: choose from {', '.join([*POLICIES, *BOUNDS])}")
    if costs not in COSTS:
        raise InvalidRequestError(f"unknown costs {costs!r}: choose from {', '.join(COSTS)}")
    by_target, ceilings = load_run(run_dir)
    rounds = read_rounds(run_dir) if costs == "observed" else []
    if costs == "observed" and not rounds:
        raise InvalidRequestError(f"{run_dir} has no rounds.jsonl to price by its own forwards: use --costs recorded")
    rows = []
    for target, streams in by_target.items():
        mine = {c["category"]: c for c in ceilings if c.get("target_name") == target}
        curves = {cat: {int(b): ms for b, ms in c["v_ms"].items()} for cat, c in mine.items()}
        if costs != "recorded":  # a run from before observed pricing recorded its timed curve as v_ms
            curves = {cat: {int(b): ms for b, ms in c.get("timed_v_ms", c["v_ms"]).items()} for cat, c in mine.items()}
        if costs == "observed":
            curves = observed_curves(curves, rounds, target)[0]
        first = next(iter(mine.values()))
        recorded = SuffixConfig(**first["suffix"]) if "suffix" in first else SuffixConfig()  # older runs: defaults
        suffix = recorded if rematch is None else dataclasses.replace(recorded, rematch=rematch)
        ceiling_of = {cat: c["drafter_ceiling"] for cat, c in mine.items()}
        best_of = {cat: c["best_ceiling"] for cat, c in mine.items()}
        if suffix != recorded or costs != "recorded":
            ceiling_of = {cat: t.ceiling for cat, t in drafter_ceiling(streams, curves, first["k_max"], suffix).items()}
        if costs != "recorded":
            best_of = {cat: t.ceiling for cat, t in best_ceiling(streams, curves, first["k_max"]).items()}
        for policy in policies:
            replayed = (BOUNDS[policy](streams, curves, first["k_max"], suffix) if policy in BOUNDS else
                        replay(streams, curves, policy=POLICIES[policy], k_max=first["k_max"], suffix=suffix))
            for r in replayed:
                ceiling = ceiling_of[r.category]
                rows.append({"target_name": target, "category": r.category, "policy": policy,
                             "speedup": r.speedup, "kept_share": r.kept_share(ceiling), "ceiling": ceiling,
                             "best_ceiling": best_of[r.category], "rounds": r.rounds,
                             "verified": r.verified, "accepted": r.accepted, "tokens": r.tokens})
    return rows
