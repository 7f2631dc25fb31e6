"""summary.json, report.md and the console table of an endpoint bench (endpoint.py).

The ratios are the local bench's (ratios.py) with A in AR's place: B's speedup
= A time per output token / B time per output token over the same prompts; the
decode ratio takes TTFT out ((wall − TTFT) per output token), the prefill one
is TTFT per prompt token (client-side TTFT: network and queueing included); the
Σ-wall ratio covers the pairs of equal output length. Verdict per category:
B is faster iff ratios.worth_it (p50 > 1, total > 1, most prompts faster).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .distributions import distribution
from .endpoint import EndpointRun
from .endpoint_metrics import speculation
from .ratios import fmt_x, identity_cell, wall_cell, worth_it
from .report import group_rows, round_counts
from .tables import md_table

HEADER = ("category", "T", "B speedup", "p50 [min–max]", "faster", "decode/tok", "prefill (TTFT)/tok",
          "Σ wall [same len]", "identical", "A tok/s", "B tok/s")
NOTE = ("B speedup = A time per output token / B time per output token over the same prompts (= B tok/s / A tok/s); "
        "p50 [min–max] over per-prompt ratios; decode/tok: the same with TTFT taken out; prefill (TTFT)/tok: A TTFT "
        "per prompt token / B's; Σ wall: Σ A wall / Σ B wall over the pairs whose output lengths match "
        "[matching/all]; identical: B's text equal to A's at T=0 [identical/compared]. Times are client-side.")
_ZERO = round_counts([])


def as_bench(rec: dict) -> dict:
    """An endpoint record in the local bench's shape: A as the baseline ("ar"), B as method "B"."""
    ident = rec.get("identity")
    return {**rec, "method": "ar" if rec["endpoint"] == "A" else "B", "k": None, "target": None, "draft": None,
            "prefill_ms": rec["ttft_ms"] if rec["ttft_ms"] is not None else 0.0, "draft_ms": 0.0, "verify_ms": 0.0,
            **_ZERO, "identity": None if ident is None else {**ident,
                                                             "first_divergence": ident["first_divergence_char"]}}


def _dist_cell(d: dict) -> str:
    return " / ".join("-" if d[q] is None else f"{d[q]:.1f}" for q in ("p50", "p95", "p99"))


def latency_rows(requests: Sequence[dict]) -> list[dict]:
    """Per endpoint × category × T: TTFT, per-token latency (TPOT) and ITL distributions, tok/s."""
    out = []
    for key in dict.fromkeys((r["endpoint"], r["category"], r["temperature"]) for r in requests):
        recs = [r for r in requests if (r["endpoint"], r["category"], r["temperature"]) == key]
        wall = sum(r["wall_ms"] for r in recs)
        out.append({"endpoint": key[0], "category": key[1], "temperature": key[2], "requests": len(recs),
                    "tokens_per_s": 1000.0 * sum(r["output_tokens"] for r in recs) / wall if wall else 0.0,
                    "ttft_ms": distribution(r["ttft_ms"] for r in recs),
                    "tpot_ms": distribution(r["tpot_ms"] for r in recs),
                    "itl_ms": distribution(g for r in recs for g in r["itl_ms"])})
    return out


def b_vs_a(rows: Sequence[dict]) -> list[dict]:
    """The verdict per category × T × max_new_tokens: is B faster than A?"""
    out = []
    for r in rows:
        if r["method"] != "B" or r["speedup"] is None or r["speedup_dist"]["p50"] is None:
            continue
        d, yes = r["speedup_dist"], worth_it(r)
        text = (f"{'yes' if yes else 'no'}: B {d['p50']:.2f}× A (p50; total {r['speedup']:.2f}×, range "
                f"{d['min']:.2f}–{d['max']:.2f}×), {r['prompts_faster']}/{r['prompts']} prompts faster")
        if r["identity"]:
            text += f"; identical outputs {r['identity']['identical']}/{r['identity']['compared']}"
        out.append({"category": r["category"], "temperature": r["temperature"], "max_new_tokens": r["max_new_tokens"],
                    "b_faster": yes, "evidence": text, "identity": r["identity"]})
    return out


def build_summary(run: EndpointRun, config: dict, quiet: dict | None) -> dict:
    rows = group_rows([as_bench(r) for r in run.requests])
    idents = [r["identity"] for r in run.requests if r.get("identity")]
    diverged = [r for r in run.requests if r.get("identity") and not r["identity"]["identical"]]
    return {"mode": "endpoint", "config": config, "error": run.error, "partial": run.error is not None,
            "endpoints": [{"label": e.label, "url": e.url, "model": e.model,
                           "speculation": speculation(run.metrics_before.get(e.label, {}),
                                                      run.metrics_after.get(e.label, {}))} for e in run.endpoints],
            "requests": len(run.requests), "rows": rows, "verdicts": b_vs_a(rows),
            "latency": latency_rows(run.requests), "concurrency": run.concurrency,
            "identity": {"compared": len(idents), "identical": sum(1 for i in idents if i["identical"]),
                         "divergences": [{"request_id": r["request_id"], "category": r["category"],
                                          "prompt_index": r["prompt_index"], **r["identity"]} for r in diverged]},
            "quiet_wait": quiet, "wall_s": (run.ended or run.started) - run.started}


def table_rows(summary: dict) -> list[tuple[str, ...]]:
    rows = summary["rows"]
    a_tok = {(r["category"], r["temperature"], r["max_new_tokens"]): r["tokens_per_s"]
             for r in rows if r["method"] == "ar"}
    out = []
    for r in rows:
        if r["method"] != "B":
            continue
        d = r["speedup_dist"]
        p50 = "-" if d["p50"] is None else f"{d['p50']:.2f} [{d['min']:.2f}–{d['max']:.2f}]"
        out.append((r["category"], f"{r['temperature']:g}", fmt_x(r["speedup"]), p50,
                    f"{r['prompts_faster']}/{r['prompts']}", fmt_x(r["decode_speedup"]), fmt_x(r["prefill_speedup"]),
                    wall_cell(r), identity_cell(r),
                    f"{a_tok.get((r['category'], r['temperature'], r['max_new_tokens']), 0.0):.1f}",
                    f"{r['tokens_per_s']:.1f}"))
    return out


def _spec_rows(summary: dict) -> list[tuple[str, ...]]:
    out = []
    for e in summary["endpoints"]:
        s = e["speculation"]
        if not s.get("source"):
            out.append((e["label"], "-", "-", "-", "-", "-", s.get("why") or "-"))
            continue
        f = (lambda v, spec=".3f": "-" if v is None else format(v, spec))
        out.append((e["label"], s["source"], f(s.get("drafted"), ".0f"), f(s.get("accepted"), ".0f"),
                    f(s["acceptance_rate"]), f(s["mean_acceptance_length"], ".2f"),
                    " ".join(f"{x:.2f}" for x in s["per_position_acceptance"]) or "-"))
    return out


def render_markdown(summary: dict, manifest: dict) -> str:
    eps = summary["endpoints"]
    parts = ["# speclm bench report: endpoints", "",
             *[f"- {e['label']}: {e['url']} (model `{e['model']}`)" for e in eps], "",
             f"CPU of this client: {manifest['machine']['cpu_model']}, {manifest['machine']['cores']} cores. "
             f"Load average before {manifest['load_average']['before'][0]:.2f}, after "
             f"{manifest['load_average']['after'][0]:.2f}. Wall {summary['wall_s']:.0f} s, "
             f"{summary['requests']} requests.", ""]
    if summary["error"]:
        parts += [f"> **PARTIAL RESULTS**: the run stopped: {summary['error']}", ""]
    parts += [f"> **WARNING**: {w}" for w in summary.get("warnings", [])]
    if len(eps) > 1:
        parts += ["## B vs A per category", ""]
        parts += [f"- **{v['category']}** (T={v['temperature']:g}, {v['max_new_tokens']} tokens): is B faster? "
                  f"{v['evidence']}" for v in summary["verdicts"]]
        parts += ["", NOTE, "", md_table(HEADER, table_rows(summary))]
        ident = summary["identity"]
        parts += ["", "## Output identity at T=0", "",
                  f"{ident['identical']}/{ident['compared']} outputs of B identical to A's (text)."
                  if ident["compared"] else "No T=0 pairs compared."]
        parts += [f"- {d['category']} #{d['prompt_index']} ({d['request_id']}): first difference at character "
                  f"{d['first_divergence_char']} ({d['a_tokens']} vs {d['b_tokens']} tokens)"
                  for d in ident["divergences"]]
    lat = [(r["endpoint"], r["category"], f"{r['temperature']:g}", str(r["requests"]), f"{r['tokens_per_s']:.1f}",
            _dist_cell(r["ttft_ms"]), _dist_cell(r["tpot_ms"]), _dist_cell(r["itl_ms"])) for r in summary["latency"]]
    parts += ["", "## Latency per endpoint (ms, client side)", "",
              "TTFT: request → first content; per-token: (last − first content) / (tokens − 1); ITL: gaps between "
              "streamed deltas (a delta carrying a speculative round's tokens is one gap).", "",
              md_table(("endpoint", "category", "T", "requests", "tok/s", "TTFT p50/p95/p99", "per-token p50/p95/p99",
                        "ITL p50/p95/p99"), lat)]
    if summary["concurrency"]:
        conc = [(c["endpoint"], str(c["concurrency"]), f"{c['temperature']:g}", str(c["requests"]),
                 f"{c['throughput_tok_s']:.1f}", _dist_cell(c["latency_ms"]), _dist_cell(c["ttft_ms"]),
                 _dist_cell(c["itl_ms"])) for c in summary["concurrency"]]
        parts += ["", "## Throughput under concurrency", "", "N closed-loop clients, every prompt once.", "",
                  md_table(("endpoint", "N", "T", "requests", "tok/s", "latency p50/p95/p99", "TTFT p50/p95/p99",
                            "ITL p50/p95/p99"), conc)]
    parts += ["", "## Speculation metrics (the servers' /metrics, after − before)", "",
              "Counter differences over this run (other traffic to the server included).", "",
              md_table(("endpoint", "source", "drafted", "accepted", "acceptance rate", "mean acceptance length",
                        "per-position acceptance"), _spec_rows(summary)), ""]
    return "\n".join(parts)


def print_console(summary: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table
    if len(summary["endpoints"]) > 1:
        table = Table(title="speclm bench --endpoint: B vs A per category (same prompts, interleaved)")
        for i, name in enumerate(HEADER):
            table.add_column(escape(name), justify="left" if i < 2 else "right")
        for row in table_rows(summary):
            table.add_row(*map(escape, row))
        console.print(table)
        for v in summary["verdicts"]:
            console.print(f"is B faster for [bold]{escape(v['category'])}[/] (T={v['temperature']:g})? "
                          f"{escape(v['evidence'])}")
    for r in summary["latency"]:
        console.print(f"{r['endpoint']} {escape(r['category'])} T={r['temperature']:g}: {r['tokens_per_s']:.1f} tok/s, "
                      f"TTFT p50/p95/p99 {_dist_cell(r['ttft_ms'])} ms, ITL {_dist_cell(r['itl_ms'])} ms")
    for c in summary["concurrency"]:
        console.print(f"{c['endpoint']} N={c['concurrency']}: {c['throughput_tok_s']:.1f} tok/s")
    for e in summary["endpoints"]:
        s = e["speculation"]
        if s.get("source") and s.get("acceptance_rate") is not None:
            console.print(f"{e['label']} /metrics ({s['source']}): acceptance rate {s['acceptance_rate']:.3f}, "
                          f"mean acceptance length {s['mean_acceptance_length'] or 0:.2f}")


def write_outputs(out_dir: Path, summary: dict, manifest: dict) -> Path:
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    report = out_dir / "report.md"
    report.write_text(render_markdown(summary, manifest), encoding="utf-8")
    return report
