"""The local bench's report: its sections in report.md's order, built once from a run
(run/sequential.BenchRun) and its figures (analysis/figures.py) and rendered to
summary.json, report.md and the console (sections.py)."""

from __future__ import annotations

from ..analysis.figures import Figures
from .cells import num
from .concurrency import concurrency_section
from .results import acceptance_section, distributions_section, identity_section, results_section, verdicts_section
from .sections import Section, warnings_section
from .speculation import (ceiling_section, halves_section, heads_section, projection_section, ssd_section,
                          structured_section)
from .trust import contamination_section
from .variants_section import variants_section


def header_section(run, config: dict, manifest: dict) -> Section:
    """The models, the machine, the load and the run's size (and the config it ran)."""
    m = manifest
    targets, drafts = m["models"].get("targets") or [m["models"]["target"]], m["models"].get("drafts") or []
    peak_rss = max((r["peak_rss_mb"] for r in run.requests), default=None)
    data = {"config": config, "load_before": list(run.load_before), "load_after": list(run.load_after),
            "wall_s": run.ended - run.started, "peak_rss_mb": peak_rss}
    md = [(f"Target (output is lossless against): `{targets[0]['name']}`" if len(targets) < 2 else
           "Targets (each output is lossless against its own): " + ", ".join(f"`{t['name']}`" for t in targets))
          + (f"; draft{'s' if len(drafts) > 1 else ''} " + ", ".join(f"`{d['name']}`" for d in drafts)
             if drafts else ""),
          f"CPU: {m['machine']['cpu_model']}, {m['machine']['cores']} cores, {m['machine']['threads'] or '-'} threads. "
          f"Load average before {run.load_before[0]:.2f}, after {run.load_after[0]:.2f}. "
          f"Wall {data['wall_s']:.0f} s, peak RSS {num(peak_rss, '.0f')} MiB."]
    return Section("speclm bench report", data, md)


def plots_section(plots: list[str]) -> Section:
    return Section("Plots", markdown=[f"![{p}]({p})" for p in plots] + [""])


def bench_sections(run, config: dict, manifest: dict, figures: Figures, plots: list[str], *,
                   contamination: dict | None = None) -> list[Section]:
    """`config`: BenchConfig.to_dict(), whose "contamination" carries what the trust checks
    observed; `contamination`: the trust stage's verdict (trust.starvation.starvation_summary);
    `plots`: their paths."""
    f, rows = figures, figures.rows
    trust = config.get("contamination") or {}
    return [header_section(run, config, manifest),
            warnings_section(run.warnings),
            verdicts_section(f.verdicts, busy=bool(run.warnings)),
            variants_section(f.variants),
            results_section(rows, config["max_new_tokens"]),
            contamination_section(contamination, trust.get("observed", {}).get("reruns", [])),
            halves_section(f.halves),
            ceiling_section(f.ceilings, rows, len({v.get("target") for v in f.verdicts}) > 1),
            ssd_section(rows),
            structured_section(rows),
            projection_section(f.projection),
            heads_section(f.heads),
            distributions_section(rows),
            acceptance_section(rows),
            identity_section(f.divergences),
            concurrency_section(f.concurrency, f.paired),
            plots_section(plots)]
