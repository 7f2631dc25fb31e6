"""The write stage: a measured, judged and analysed run into its output directory.

summary.json, manifest.json and report.md from one list of sections (report.py,
sections.py), the plots, and streams.jsonl (the greedy streams `speclm bench
replay` reads). The traces (requests.jsonl, rounds.jsonl, ...) were written by
the run stage as requests finished.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ..analysis.figures import Figures
from ..run.manifest import build_manifest
from ..run.sequential import BenchRun
from ..setup.config import BenchConfig
from ..setup.workloads import Prompt, prompt_set_hash
from .plots import write_plots
from .report import bench_sections
from .sections import write_report


def write_outputs(out_dir: Path, run: BenchRun, figures: Figures, cfg: BenchConfig, prompts: Sequence[Prompt], *,
                  targets: list[dict], drafts: list[dict], contamination: dict | None,
                  threads: int | None = None, dataset: str | None = None) -> dict:
    """Every output file of `run`; `targets`/`drafts` are describe_model dicts (the first of
    each heads the manifest); `contamination`: the trust stage's verdict. Returns
    {"summary", "manifest", "report" (report.md's path), "sections" (for the console)}."""
    drafts = drafts if cfg.uses_draft() else []
    manifest = build_manifest(
        target=targets[0], draft=drafts[0] if drafts else None, targets=targets, drafts=drafts,
        config=cfg.to_dict(), prompts_hash=prompt_set_hash(prompts), n_prompts=len(prompts),
        categories=list(dict.fromkeys(p.category for p in prompts)), dataset=dataset,
        threads=threads, seed=cfg.seed, load_before=run.load_before,
        load_after=run.load_after, started=run.started, ended=run.ended)
    if figures.streams:
        with open(out_dir / "streams.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in figures.streams)
    plots = write_plots(figures.rows, figures.concurrency, figures.latencies, out_dir)
    sections = bench_sections(run, cfg.to_dict(), manifest, figures, plots, contamination=contamination)
    summary, report = write_report(out_dir, sections, manifest)
    return {"summary": summary, "manifest": manifest, "report": report, "sections": sections}
