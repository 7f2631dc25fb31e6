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
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ...api import LLM
from ...costs import time_curve
from ..analysis import ceiling
from ..setup.config import make_arms
from ..setup.plan import BenchPlan
from .models import Models, Turn, finish_turn, turns
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


class ProgressBars:
    """Request (and concurrency) progress bars on stderr, or nothing."""

    def __init__(self, show: bool, requests: int, concurrency: int):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True)) if show else None
        if self.bar:
            self.bar.start()
            self.req = self.bar.add_task("requests", total=requests)
            self.conc = self.bar.add_task("concurrency", total=concurrency, visible=concurrency > 0)

    def on_request(self, record: dict) -> None:
        if self.bar:
            self.bar.advance(self.req)

    def on_concurrency(self, row: dict) -> None:
        if self.bar:
            self.bar.advance(self.conc)

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()


def ceiling_input(llm: LLM, plan: BenchPlan, requests: Sequence[dict],
                  encoded: Sequence[list[int]]) -> ceiling.CeilingInput | None:
    """One target's copy-ceiling input, timed and tokenized while it is loaded: each category's
    v(1..ceiling_k + 1) after as many tokens as its average round sees (median of
    ceiling.REPEATS). None without greedy AR records."""
    ar = ceiling.greedy_ar(requests)
    if not ar:
        return None
    ids: dict[tuple[str, int], list[int]] = dict(zip(((p.category, p.index) for p in plan.prompts), encoded))
    timed = {cat: time_curve(llm.target, range(1, plan.ceiling_k + 2),
                             ceiling.timing_context([r for r in ar if r["category"] == cat], ids),
                             repeats=ceiling.REPEATS, statistic=statistics.median)
             for cat in dict.fromkeys(r["category"] for r in ar)}
    predictions = {(p.category, p.index): llm.prediction_ids(p.prediction, "suffix", plan.cfg.base)
                   for p in plan.prompts if p.prediction is not None}
    tokens = {t for seq in [*ids.values(), *predictions.values(), *(r["token_ids"] for r in ar)] for t in seq}
    return ceiling.CeilingInput(ar[0].get("target_name"), ar, ids, timed, predictions,
                                {t: llm.target.token_bytes(t) for t in tokens})


def run_turn(turn: Turn, plan: BenchPlan, models: Models, sink: TraceSink, bars: ProgressBars,
             first_id: int) -> tuple[BenchRun, ceiling.CeilingInput | None]:
    """One target's requests (ids counting on from first_id), then, while it is warm, its
    v(b) (into `models`) and its copy-ceiling input (None when none is planned)."""
    encoded = encode_prompts(turn.llm, plan.prompts, max(plan.cfg.max_new_tokens))
    run = run_bench(turn.llm, plan.prompts, plan.cfg, sink, bars.on_request, bars.on_concurrency,
                    arms=make_arms(plan.cfg, turn.llm, turn.drafts), meta=turn.meta, first_id=first_id,
                    encoded=dict(zip(plan.prompts, encoded)))
    if plan.target_count > 1:
        run.warnings = [f"{turn.meta['target_name']}: {w}" for w in run.warnings]
    finish_turn(turn, models, encoded)
    found = ceiling_input(turn.llm, plan, run.requests, encoded) if plan.ceiling_methods else None
    return run, found


def run_plan(plan: BenchPlan, out_dir: Path, *, progress: bool = True) -> Measured:
    """Measure `plan`: its requests stream to out_dir's traces (trace.py); what the trust checks
    saw is appended to plan.cfg.observed. Models by name are closed when it returns."""
    runs: list[BenchRun] = []
    ceilings: list[ceiling.CeilingInput] = []
    with turns(plan) as (each, models):  # its text set is checked before anything is written or loaded
        out_dir.mkdir(parents=True, exist_ok=True)
        started, load_before = time.time(), os.getloadavg()
        sink, bars = TraceSink(out_dir), ProgressBars(progress, *plan.planned())
        try:
            for turn in each:
                run, found = run_turn(turn, plan, models, sink, bars, sum(len(r.requests) for r in runs))
                runs.append(run)
                ceilings += [found] if found else []
        finally:
            bars.stop()
            sink.close()
    return Measured(merge_runs(runs, load_before, started), models, ceilings)
