"""The run stage: a planned run (setup/plan.py) measured, target by target.

Per target (run/models.py loads them in turn, or takes the LLM given): the
sweep of methods × K × prompts, AR first per prompt (sequential.py, then the
concurrency rows); every config of a method that needs a draft runs once per
draft, right after the same AR request, on that draft's LLM over the same
loaded target. Then, with the target still warm, its v(b) for the variants
section and, for the copy ceiling, each category's curve and what the ceiling
needs of the tokenizer. Timings of different targets are not interleaved (one
target is loaded at a time); each speedup is against the AR requests of its own
target, interleaved per prompt. Traces stream to out_dir as requests finish.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..analysis import ceiling
from ..setup.config import make_arms
from ..setup.plan import BenchPlan
from .ceiling_input import ceiling_input
from .models import Models, finish_turn, turns
from .progress import ProgressBars
from .sequential import BenchRun, encode_prompts, run_bench
from .trace import TraceSink


@dataclass
class Measured:
    """What the run stage measured: every target's requests merged, what it learnt of the
    models, and one copy-ceiling input per target (none when no ceiling was planned)."""

    run: BenchRun
    models: Models
    ceilings: list[ceiling.CeilingInput]


def merge_runs(runs: Sequence[BenchRun], load_before: tuple, started: float) -> BenchRun:
    return BenchRun([r for run in runs for r in run.requests], [c for run in runs for c in run.concurrency],
                    load_before, os.getloadavg(), started, time.time(),
                    list(dict.fromkeys(w for run in runs for w in run.warnings)))


def run_plan(plan: BenchPlan, out_dir: Path, *, progress: bool = True) -> Measured:
    """Measure `plan`: its requests stream to out_dir's traces (trace.py); what the trust checks
    saw is appended to plan.cfg.observed. Models by name are closed when it returns.
    Per target: its requests (ids counting on across targets), then, while it is warm, its
    variants line (models.finish_turn) and its copy-ceiling input where one is planned."""
    runs: list[BenchRun] = []
    ceilings: list[ceiling.CeilingInput] = []
    with turns(plan) as (each, models):
        out_dir.mkdir(parents=True, exist_ok=True)
        started, load_before = time.time(), os.getloadavg()
        sink, bars = TraceSink(out_dir), ProgressBars(progress, *plan.planned())
        try:
            for turn in each:
                encoded = encode_prompts(turn.llm, plan.prompts, max(plan.cfg.max_new_tokens))
                run = run_bench(turn.llm, plan.prompts, plan.cfg, make_arms(plan.cfg, turn.llm, turn.drafts), sink,
                                bars.on_request, bars.on_concurrency, meta=turn.meta,
                                first_id=sum(len(r.requests) for r in runs), encoded=dict(zip(plan.prompts, encoded)))
                if plan.target_count > 1:
                    run.warnings = [f"{turn.meta['target_name']}: {w}" for w in run.warnings]
                finish_turn(turn, models, encoded)
                found = ceiling_input(turn.llm, plan, run.requests, encoded) if plan.ceiling_methods else None
                runs.append(run)
                ceilings += [found] if found else []
        finally:
            bars.stop()
            sink.close()
    return Measured(merge_runs(runs, load_before, started), models, ceilings)
