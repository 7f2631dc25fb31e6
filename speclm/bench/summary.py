"""summary.json and report.md of a bench run: the per-group rows and verdicts
(report.py) with the sections other modules compute — first vs second half
(halves.py), contamination re-runs (contamination.py), the SSD projection
(projection.py), Medusa heads (heads_report.py), the copy ceiling (ceiling.py, set by
the sweep)."""

from __future__ import annotations

from collections.abc import Sequence

from .ceiling import render as render_ceiling
from .trust.starvation import render as render_contamination
from .trust.starvation import summarize
from .halves import halves
from .heads_report import heads_rows
from .heads_report import render as render_heads
from .halves import render as render_halves
from .setup.methods import BASELINE
from .projection import project
from .scaling import paired
from .scaling import table as paired_table
from .projection import render as render_projection
from .report import (MAIN_HEADER, RATIOS_NOTE, _f, divergences, group_rows, identity_note, label, models_vary,
                     render_ssd, render_variants, table_rows, verdicts)
from .tables import md_table


def build_summary(run, config: dict) -> dict:
    """summary.json: rows, verdicts, halves, identity, concurrency, contamination, load and
    warnings of a BenchRun (config: BenchConfig.to_dict(), whose "contamination" carries what
    the check observed)."""
    rows = group_rows(run.requests)
    return {"config": config, "rows": rows, "verdicts": verdicts(rows), "halves": halves(run.requests),
            "contamination": summarize(run.requests, config.get("contamination")),
            "ssd_projection": project(run.requests), "medusa": heads_rows(run.requests),
            "identity_divergences": divergences(run.requests), "concurrency": run.concurrency,
            "concurrency_paired": paired(run.concurrency),
            "load_before": list(run.load_before), "load_after": list(run.load_after),
            "warnings": list(run.warnings), "wall_s": run.ended - run.started,
            "peak_rss_mb": max((r["peak_rss_mb"] for r in run.requests), default=None)}


def render_markdown(summary: dict, manifest: dict, plots: Sequence[str]) -> str:
    """report.md: warnings, verdicts, main table, distributions, acceptance, identity, concurrency."""
    m, models = manifest, models_vary(summary["rows"])
    targets, drafts = m["models"].get("targets") or [m["models"]["target"]], m["models"].get("drafts") or []
    parts = ["# speclm bench report", "",
             (f"Target (output is lossless against): `{targets[0]['name']}`" if len(targets) < 2 else
              "Targets (each output is lossless against its own): " + ", ".join(f"`{t['name']}`" for t in targets))
             + (f"; draft{'s' if len(drafts) > 1 else ''} " + ", ".join(f"`{d['name']}`" for d in drafts)
                if drafts else ""),
             f"CPU: {m['machine']['cpu_model']}, {m['machine']['cores']} cores, {m['machine']['threads'] or '-'} threads. "
             f"Load average before {summary['load_before'][0]:.2f}, after {summary['load_after'][0]:.2f}. "
             f"Wall {summary['wall_s']:.0f} s, peak RSS {_f(summary['peak_rss_mb'], '.0f')} MiB.", ""]
    parts += [f"> **WARNING**: {w}" for w in summary["warnings"]] + [""] if summary["warnings"] else []
    parts += ["## Enable speculation here?", ""]
    if summary["warnings"]:
        parts += ["_The machine was busy (see the warning above): these verdicts rest on noisy timings._", ""]
    several = len({v.get("target") for v in summary["verdicts"]}) > 1
    parts += [f"- **{v['category']}**" + (f" on `{v.get('target_name') or v.get('target')}`" if several else "")
              + f" (T={v['temperature']:g}, {v['max_new_tokens']} tokens): {v['evidence']}{identity_note(v)}"
              for v in summary["verdicts"]]
    if summary.get("variants"):
        parts += render_variants(summary["variants"])
    ssd_part = render_ssd(summary["rows"]) + render_projection(summary.get("ssd_projection", []))
    halves_part = render_halves(summary.get("halves", []))  # first vs second half of each category
    observed = (summary["config"].get("contamination") or {}).get("observed", {})
    trust_part = render_contamination(summary.get("contamination"), observed.get("reruns", []))
    parts += ["", "## Results", "", RATIOS_NOTE, "", md_table(MAIN_HEADER, table_rows(summary)), *trust_part,
              *halves_part, *render_ceiling(summary.get("copy_ceiling", []), summary["rows"]), *ssd_part,
              *render_heads(summary.get("medusa", []), summary["rows"]),
              "", "## Distributions (ms)", ""]
    dist_rows = [(r["category"], label(r, models), f"{r['temperature']:g}",
                  *(" / ".join(_f(r[key][q], ".0f") for q in ("p50", "p95", "p99"))
                    for key in ("latency_ms", "ttft_ms", "tpot_ms")),
                  f"{r['draft_share']:.0%} / {r['verify_share']:.0%}") for r in summary["rows"]]
    parts += [md_table(("category", "method", "T", "latency p50/p95/p99", "TTFT p50/p95/p99",
                         "TPOT p50/p95/p99", "draft / verify share"), dist_rows), "",
              "## Per-position acceptance and rejections", ""]
    acc_rows = [(r["category"], label(r, models), f"{r['temperature']:g}",
                 " ".join(f"{x:.2f}" for x in r["per_position_acceptance"]),
                 " ".join(str(x) for x in r["counts"]["rejection_hist"]), str(r["counts"]["full_accepts"]))
                for r in summary["rows"] if r["method"] != BASELINE]
    parts += [md_table(("category", "method", "T", "acceptance at j=1..K", "rejections at j=1..K",
                         "all accepted"), acc_rows), "", "## Greedy identity with AR", ""]
    divs = summary["identity_divergences"]
    parts += ["All greedy outputs identical to AR." if not divs else
              "Differences (a tiny AR top-1/top-2 margin points at batch numerics, a large one at a bug):"]
    parts += [f"- {d['category']} #{d['prompt_index']} {label(d, models)}: token {d['first_divergence']}, "
              f"margin {_f(d['ar_top2_margin'], '.4f')}" for d in divs]
    if summary["concurrency"]:
        repeats = max(c.get("repeat", 0) for c in summary["concurrency"]) + 1
        conc_rows = [(str(c["concurrency"]), label(c, models), f"{c['temperature']:g}",
                      *([str(c.get("repeat", 0) + 1)] if repeats > 1 else []), _f(c["throughput_tok_s"], ".1f"),
                      *(" / ".join(_f(c[key][q], ".0f") for q in ("p50", "p95", "p99"))
                        for key in ("latency_ms", "ttft_ms", "ttft_first_wave_ms", "ttft_steady_ms")),
                      str(c["ttft_steady_ms"]["n"])) for c in summary["concurrency"]]
        parts += ["", "## Concurrency", "", "N closed-loop clients over every prompt. First wave: the first N "
                  "requests, arriving together; steady: the later ones, each arriving while the others decode."
                  + (" Rows in run order; each repeat is a pass over every N, AR and the methods alternating "
                     "who runs first." if repeats > 1 else ""), "",
                  md_table(("N", "method", "T", *(["repeat"] if repeats > 1 else []), "tok/s", "latency p50/p95/p99",
                            "TTFT p50/p95/p99", "TTFT first wave p50/p95/p99", "TTFT steady p50/p95/p99",
                            "steady n"), conc_rows)]
        entries = summary.get("concurrency_paired") or paired(summary["concurrency"])
        header, rows = paired_table(entries, lambda e: label(e, models))
        parts += ["", "Ratios within a repeat (rows run back to back, so machine drift falls on both): "
                  "median [min–max] over the repeats; below AR counts the repeats in which the method's "
                  "throughput was lower than AR's at the same N.", "", md_table(header, rows)]
    parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(parts)
