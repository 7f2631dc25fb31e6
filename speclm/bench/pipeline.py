"""The bench as one pipeline of stages; `speclm bench` and the tests both run it.

    plan     setup/plan.py       what runs, on which models, checked before any loads
    run      run/sweep.py        every target's requests, v(b) and ceiling curves (run/models.py)
    trust    trust/starvation.py the whole run's contamination verdict and warnings of what
                                 is still starved (each request was flagged and re-run as
                                 it ran: trust/)
    analyse  analysis/figures.py every figure, from the records alone
    write    output/write.py     summary.json, manifest.json, report.md, plots, streams.jsonl
"""

from __future__ import annotations

from pathlib import Path

from .analysis.ceiling import read_rounds
from .analysis.figures import analyse
from .output.write import write_outputs
from .run.sweep import run_plan
from .setup.plan import BenchPlan
from .trust.starvation import starvation_summary, starved_warnings


def run_pipeline(plan: BenchPlan, out_dir: Path, *, progress: bool = True) -> dict:
    """Run `plan` (setup/plan.plan_bench) and write every output into out_dir. Returns
    {"summary", "manifest", "report" (report.md's path), "sections" (for the console)}."""
    measured = run_plan(plan, out_dir, progress=progress)
    run, models, cfg = measured.run, measured.models, plan.cfg
    run.warnings += starved_warnings(run.requests, run.concurrency)
    contamination = starvation_summary(run.requests, cfg.to_dict()["contamination"])
    rounds = read_rounds(out_dir) if measured.ceilings else []
    figures = analyse(run.requests, run.concurrency, rounds, measured.ceilings,
                      targets=models.targets, drafts=list(models.drafts.values()),
                      ceiling_methods=plan.ceiling_methods, ceiling_k=plan.ceiling_k, suffix=cfg.base.suffix,
                      quality=plan.variant_quality, text_labels=[label for label, _ in plan.texts])
    return write_outputs(out_dir, run, figures, cfg, plan.prompts, targets=models.described_targets,
                         drafts=models.described_drafts, contamination=contamination, threads=models.threads,
                         dataset=plan.dataset)
