"""Targets × drafts in one bench run (`speclm bench --targets A,B --drafts X,Y`).

Each target is loaded in turn (then closed) and gets the normal sweep
(methods × K × prompts, AR first per prompt); every config of a method that
needs a draft runs once per draft, right after the same AR request, on that
draft's LLM over the same loaded target. The drafts stay loaded for the
whole run. `--target/--draft` is a sweep of one.

Per model it also records file, size and sha256 (manifest.describe_model),
the score-cost curve v(k) (speclm.costs.time_blocks after the target's
requests, median of V_REPEATS) and, with `variant_quality`, perplexity on
the quality text set and teacher-forced greedy agreement with the first
target (analysis/quality.py). Timings of different targets
are not interleaved (one target is loaded at a time); each speedup is
against the AR requests of its own target, interleaved per prompt.

`write_outputs` writes summary.json (with a "variants" section for a sweep),
manifest.json, report.md and plots for any BenchRun, all from one list of
sections (output/report.py), which it returns for the console.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ...api import LLM
from ...backends.base import Backend
from ...backends.load import load_backend
from ...costs import TIMED_K, time_blocks, time_curve
from ...speculative.replay import replay
from ...errors import InvalidRequestError
from ...models.catalog import resolve_model
from ...models.registry import DEFAULT_TARGET, default_draft
from ...speculative.methods import METHODS as TABLE
from ..analysis import ceiling, quality
from ..analysis.groups import group_rows
from ..analysis.variants import V_KS, V_REPEATS, build_variants
from ..output.plots import write_plots
from ..output.report import bench_sections
from ..output.sections import write_report
from ..setup.config import BenchConfig, make_arms
from ..setup.workloads import Prompt, prompt_set_hash
from .manifest import build_manifest, describe_model
from .sequential import BenchRun, encode_prompts, run_bench
from .trace import TraceSink

QUALITY_TEXTS = 8  # HumanEval problems added to the perplexity text set (as `speclm models compare`)


@dataclass
class SweepPlan:
    """The models of a run, checked to exist (resolved) but not loaded."""

    targets: list[str]
    drafts: list[str]  # empty when no method uses a draft


def plan_models(target: str | None, targets: list[str] | None, draft: str | None, drafts: list[str] | None,
                needs_draft: bool) -> SweepPlan:
    """Targets and drafts from --target/--targets and --draft/--drafts; every name is
    resolved here (an unknown name or unprepared NAME@QUANT fails before any model loads)."""
    if target and targets:
        raise InvalidRequestError("give --target NAME or --targets A,B,..., not both")
    if draft and drafts:
        raise InvalidRequestError("give --draft NAME or --drafts X,Y,..., not both")
    if drafts and not needs_draft:
        raise InvalidRequestError("--drafts given but no method in --methods uses a draft: add sd-draft "
                                  "(or auto, heuristic) to --methods")
    tlist = list(dict.fromkeys(targets or [target or DEFAULT_TARGET]))
    dlist = list(dict.fromkeys(drafts or ([draft] if draft else []))) if needs_draft else []
    if needs_draft and not dlist:
        if any(default_draft(t) is None for t in tlist):
            raise InvalidRequestError("method sd-draft needs a draft model: pass --draft NAME|PATH "
                                      "(or --drafts X,Y) or drop sd-draft from --methods")
        dlist = [default_draft(tlist[0])]
    for name in tlist + dlist:
        resolve_model(name)
    return SweepPlan(tlist, dlist)


def _model_entry(d: dict, q: quality.Quality) -> dict:
    """A model's line in the variants section, from its describe_model dict and quality pass."""
    return {"name": d["name"], "file": d.get("path"), "size": d.get("size"), "sha256": d.get("sha256"),
            "source": d.get("source"), "quant": d.get("quant"), "perplexity": q.perplexity,
            "ppl_tokens": q.ppl_tokens, "agreement": q.agreement, "agreement_note": q.note}


def _time_v(backend: Backend, tokens: list[list[int]]) -> dict:
    context, block = quality.timing_block(tokens, max(V_KS))
    return quality.v_summary(time_blocks([backend], context, block, V_KS, V_REPEATS)[0])


def _copy_ceiling(llm: LLM, prompts: Sequence[Prompt], requests: Sequence[dict], cfg: BenchConfig,
                  methods: list[str], k_max: int, out_dir: Path) -> list[dict]:
    """ceiling.copy_ceiling of one target's requests, each category priced by its own v(b),
    with what method auto's controller keeps of it replayed on the same outputs and curves;
    the greedy streams go to streams.jsonl (`speclm bench replay` reads them)."""
    ar = ceiling.greedy_ar(requests)
    ids = dict(zip(((p.category, p.index) for p in prompts), encode_prompts(llm, prompts, max(cfg.max_new_tokens))))
    timed = {cat: time_curve(llm.target, range(1, k_max + 2),
                             ceiling.timing_context([r for r in ar if r["category"] == cat], ids),
                             repeats=ceiling.REPEATS, statistic=statistics.median)
             for cat in dict.fromkeys(r["category"] for r in ar)}
    seen, forwards = ceiling.observed_curves(timed, ceiling.read_rounds(out_dir), ar[0].get("target_name"))
    # rounded once, as summary.json stores them, so `speclm bench replay` prices exactly as this run did
    curves = {cat: {b: round(ms, 2) for b, ms in curve.items()} for cat, curve in seen.items()}
    predictions = {(p.category, p.index): llm.prediction_ids(p.prediction, "suffix", cfg.base)
                   for p in prompts if p.prediction is not None}
    rows = ceiling.copy_ceiling(ar, ids, curves, k_max=k_max, suffix=cfg.base.suffix, methods=methods,
                                predictions=predictions, piece=llm.target.token_bytes)
    for row in rows:
        row["timed_v_ms"] = {str(b): round(ms, 2) for b, ms in timed[row["category"]].items()}
        row["forwards"] = {str(b): n for b, n in forwards[row["category"]].items()}
    streams = ceiling.streams(ar, ids, predictions)
    with open(out_dir / "streams.jsonl", "a", encoding="utf-8") as fh:
        for s in streams:
            fh.write(json.dumps({"target_name": ar[0].get("target_name"), **dataclasses.asdict(s)}) + "\n")
    replayed = {r.category: r for r in replay(streams, curves, k_max=k_max, suffix=cfg.base.suffix)}
    for row in rows:
        row.update(ceiling.replay_fields(replayed[row["category"]], row))
    return rows


def suffix_configs(cfg: BenchConfig) -> tuple[list[str], int]:
    """(the run's methods that draft by suffix, their largest K) — ([], 0) when none runs greedy."""
    if 0 not in [float(t) for t in cfg.temperatures]:
        return [], 0
    found = [(m.name, k) for m, k in cfg.configs()
             if TABLE[m.method].proposal_for(m.spec(k), has_draft=True) == "suffix"]
    return list(dict.fromkeys(n for n, _ in found)), min(TIMED_K, max((k for _, k in found), default=0))


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


def run_sweep(plan: SweepPlan, prompts: list[Prompt], cfg: BenchConfig, out_dir: Path, *, n_ctx: int = 4096,
              threads: int | None = None, dataset: str | None = None, variant_quality: bool = False,
              progress: bool = True, speculator=None, kernels: str | None = None) -> dict:
    """Run the sweep over plan's targets × drafts and write every output into out_dir
    (see write_outputs). Returns write_outputs' dict. kernels: as
    `LLM(kernels=...)`; every model's choice is in the manifest."""
    if variant_quality and n_ctx < quality.N_CTX:
        raise InvalidRequestError(f"--variant-quality scores texts of up to {quality.N_CTX} tokens: "
                                  f"raise --n-ctx to {quality.N_CTX} or more")
    texts = quality.load_texts(QUALITY_TEXTS if variant_quality else 0)
    max_seqs = max([2, *(min(n, len(prompts)) for n in cfg.concurrency)])  # a row's N: trust/phases.py
    n_arms = cfg.arm_count(len(plan.drafts))
    n_req, n_conc = cfg.planned_requests(len(prompts), n_arms), cfg.planned_rows(n_arms)
    out_dir.mkdir(parents=True, exist_ok=True)
    started, load_before = time.time(), os.getloadavg()
    sink, bars = TraceSink(out_dir), ProgressBars(progress, n_req * len(plan.targets), n_conc * len(plan.targets))
    runs: list[BenchRun] = []
    targets: list[dict] = []
    ceilings: list[dict] = []
    suffix_methods, suffix_k = suffix_configs(cfg)
    drafts: dict[str, tuple[Backend, dict]] = {}  # name -> (loaded backend, its variants entry)
    described: dict[str, dict] = {}  # name -> describe_model dict (for the manifest)
    used_threads = threads
    try:
        for name in plan.drafts:
            be = load_backend(name, n_ctx, threads, max_seqs, kernels, "decoding")
            q = quality.measure_quality(be, texts, run=False)
            described[name] = describe_model(name, be) or {}
            drafts[name] = be, {**_model_entry(described[name], q), **_time_v(be, q.tokens)}
        ref: quality.Quality | None = None
        for name in plan.targets:
            tb = load_backend(name, n_ctx, threads, max_seqs, kernels)
            try:
                used_threads = used_threads or tb.n_threads
                q = quality.measure_quality(tb, texts, ref, run=variant_quality)
                if ref is None and variant_quality:  # drafts: perplexity and agreement with the first target
                    for be, entry in drafts.values():
                        dq = quality.measure_quality(be, texts, q)
                        entry.update(perplexity=dq.perplexity, ppl_tokens=dq.ppl_tokens,
                                     agreement=dq.agreement, agreement_note=dq.note)
                ref = ref or q
                described[name] = describe_model(name, tb) or {}
                entry = _model_entry(described[name], q)
                kv = cfg.prefix_cache_tokens
                llm = LLM(target=tb, prefix_cache_tokens=kv, kernels=kernels)  # wraps the loaded backends
                d_llms = {d: (LLM(target=tb, draft=be, speculator=speculator, prefix_cache_tokens=kv, kernels=kernels),
                              {"draft_name": d, "draft_sha256": e["sha256"]})
                          for d, (be, e) in drafts.items()}
                run = run_bench(llm, prompts, cfg, sink, bars.on_request, bars.on_concurrency,
                                arms=make_arms(cfg, llm, d_llms), first_id=sum(len(r.requests) for r in runs),
                                meta={"target_name": name, "target_sha256": entry["sha256"]})
                for d_llm, _ in d_llms.values():
                    d_llm.close_speculator()  # ssd: its process holds a draft copy; the next target starts anew
                if len(plan.targets) > 1:
                    run.warnings = [f"{name}: {w}" for w in run.warnings]
                runs.append(run)
                entry.update(_time_v(tb, q.tokens))  # after its requests: the model is warm
                if suffix_methods:
                    ceilings += _copy_ceiling(llm, prompts, run.requests, cfg, suffix_methods, suffix_k, out_dir)
                targets.append(entry)
            finally:
                tb.close()
    finally:
        for be, _ in drafts.values():
            be.close()
        bars.stop()
        sink.close()
    run = merge_runs(runs, load_before, started)
    variants = build_variants(run.requests, targets, [e for _, e in drafts.values()], quality=variant_quality,
                              text_labels=[label for label, _ in texts])
    return write_outputs(out_dir, run, cfg, prompts, targets=[described[t] for t in plan.targets],
                         drafts=[described[d] for d in plan.drafts], threads=used_threads, dataset=dataset,
                         variants=variants, ceilings=ceilings)


def run_to_dir(llm: LLM, prompts: list[Prompt], cfg: BenchConfig, out_dir: Path, *,
               target_spec: str | Backend | None = None, draft_spec: str | Backend | None = None,
               threads: int | None = None, dataset: str | None = None, progress: bool = True) -> dict:
    """Run the sweep on `llm` and write every output file into out_dir.
    Returns {"summary", "manifest", "report" (report.md's path), "sections"}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n_arms = len(cfg.configs())
    sink = TraceSink(out_dir)
    bars = ProgressBars(progress, cfg.planned_requests(len(prompts), n_arms), cfg.planned_rows(n_arms))
    try:
        run = run_bench(llm, prompts, cfg, sink, on_request=bars.on_request, on_concurrency=bars.on_concurrency)
    finally:
        bars.stop()
        sink.close()
    return write_outputs(out_dir, run, cfg, prompts, targets=[describe_model(target_spec, llm.target)],
                         drafts=[describe_model(draft_spec, llm.draft)] if cfg.uses_draft() else [],
                         threads=threads or getattr(llm.target, "n_threads", None), dataset=dataset)


def write_outputs(out_dir: Path, run: BenchRun, cfg: BenchConfig, prompts: Sequence[Prompt], *,
                  targets: list[dict | None], drafts: list[dict | None], threads: int | None = None,
                  dataset: str | None = None, variants: dict | None = None,
                  ceilings: list[dict] | None = None) -> dict:
    """summary.json, manifest.json, report.md and plots of `run`; `targets`/`drafts` are
    describe_model dicts (the first of each heads the manifest). Returns {"summary",
    "manifest", "report" (report.md's path), "sections" (for the console)}."""
    drafts = drafts if cfg.uses_draft() else []
    manifest = build_manifest(
        target=targets[0], draft=drafts[0] if drafts else None, targets=targets, drafts=drafts,
        config=cfg.to_dict(), prompts_hash=prompt_set_hash(prompts), n_prompts=len(prompts),
        categories=list(dict.fromkeys(p.category for p in prompts)), dataset=dataset,
        threads=threads, seed=cfg.seed, load_before=run.load_before,
        load_after=run.load_after, started=run.started, ended=run.ended)
    rows = group_rows(run.requests)
    plots = write_plots(rows, run.concurrency, run.requests, out_dir)
    sections = bench_sections(run, cfg.to_dict(), manifest, rows, plots, variants=variants, ceilings=ceilings)
    summary, report = write_report(out_dir, sections, manifest)
    return {"summary": summary, "manifest": manifest, "report": report, "sections": sections}
