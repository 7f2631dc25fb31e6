"""The report of an endpoint bench (bench.py): its sections, from which summary.json,
report.md and the console are rendered (output/sections.py).

The ratios are the local bench's (analysis/ratios.py) with A in AR's place: B's speedup
= A time per output token / B time per output token over the same prompts; the
decode ratio takes TTFT out ((wall − TTFT) per output token), the prefill one
is TTFT per prompt token (client-side TTFT: network and queueing included); the
Σ-wall ratio covers the pairs of equal output length. Verdict per category:
B is faster iff ratios.worth_it (p50 > 1, total > 1, most prompts faster).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape

from ..analysis.counts import round_counts
from ..analysis.distributions import distribution
from ..analysis.groups import group_rows
from ..analysis.ratios import worth_it
from ..output.cells import fmt_x, identity_cell, md_table, quantiles, wall_cell
from ..output.concurrency import n_cell
from ..output.results import console_table
from ..output.sections import Section, warnings_section
from ..trust.phases import Phase
from .metrics import speculation
from .run import EndpointRun

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


def b_vs_a(rows: Sequence[dict], requests: Sequence[dict] = ()) -> list[dict]:
    """The verdict per category × T × max_new_tokens: is B faster than A? It counts B's
    requests that replayed prompts their server was sent before (trust/phases.py)."""
    out = []
    for r in rows:
        if r["method"] != "B" or r["speedup"] is None or r["speedup_dist"]["p50"] is None:
            continue
        d, yes = r["speedup_dist"], worth_it(r)
        text = (f"{'yes' if yes else 'no'}: B {d['p50']:.2f}× A (p50; total {r['speedup']:.2f}×, range "
                f"{d['min']:.2f}–{d['max']:.2f}×), {r['prompts_faster']}/{r['prompts']} prompts faster")
        if r["identity"]:
            text += f"; identical outputs {r['identity']['identical']}/{r['identity']['compared']}"
        mine = [q for q in requests if q["endpoint"] == "B" and r["category"] in (q["category"], "all")
                and (q["temperature"], q["max_new_tokens"]) == (r["temperature"], r["max_new_tokens"])]
        replayed = sum(1 for q in mine if q.get("replay"))
        if replayed:
            text += f"; {replayed}/{len(mine)} pairs REPLAY prompts the servers were sent before"
        out.append({"category": r["category"], "temperature": r["temperature"], "max_new_tokens": r["max_new_tokens"],
                    "b_faster": yes, "evidence": text, "identity": r["identity"], "replayed": replayed})
    return out


def table_rows(rows: Sequence[dict]) -> list[tuple[str, ...]]:
    """The B vs A table: one line per category × T (× max_new_tokens)."""
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


def _spec_rows(endpoints: Sequence[dict]) -> list[tuple[str, ...]]:
    out = []
    for e in endpoints:
        s = e["speculation"]
        if not s.get("source"):
            out.append((e["label"], "-", "-", "-", "-", "-", s.get("why") or "-"))
            continue
        f = (lambda v, spec=".3f": "-" if v is None else format(v, spec))
        out.append((e["label"], s["source"], f(s.get("drafted"), ".0f"), f(s.get("accepted"), ".0f"),
                    f(s["acceptance_rate"]), f(s["mean_acceptance_length"], ".2f"),
                    " ".join(f"{x:.2f}" for x in s["per_position_acceptance"]) or "-"))
    return out


def header_section(run: EndpointRun, config: dict, quiet: dict | None, manifest: dict) -> Section:
    endpoints = [{"label": e.label, "url": e.url, "model": e.model,
                  "speculation": speculation(run.metrics_before.get(e.label, {}), run.metrics_after.get(e.label, {}))}
                 for e in run.endpoints]
    data = {"mode": "endpoint", "config": config, "error": run.error, "partial": run.error is not None,
            "endpoints": endpoints, "requests": len(run.requests), "quiet_wait": quiet,
            "wall_s": (run.ended or run.started) - run.started}
    md = [*[f"- {e['label']}: {e['url']} (model `{e['model']}`)" for e in endpoints], "",
          f"CPU of this client: {manifest['machine']['cpu_model']}, {manifest['machine']['cores']} cores. "
          f"Load average before {manifest['load_average']['before'][0]:.2f}, after "
          f"{manifest['load_average']['after'][0]:.2f}. Wall {data['wall_s']:.0f} s, {len(run.requests)} requests."]
    return Section("speclm bench report: endpoints", data, md)


def b_vs_a_section(rows: list[dict], requests: Sequence[dict], compared: bool) -> Section:
    """Is B faster than A, per category (report.md and console only with two endpoints)."""
    verdicts = b_vs_a(rows, requests)
    body = table_rows(rows)
    md = [f"- **{v['category']}** (T={v['temperature']:g}, {v['max_new_tokens']} tokens): is B faster? "
          f"{v['evidence']}" for v in verdicts] + ["", NOTE, "", md_table(HEADER, body)]
    console = [console_table("speclm bench --endpoint: B vs A per category (same prompts, interleaved)", HEADER, body),
               *[f"is B faster for [bold]{escape(v['category'])}[/] (T={v['temperature']:g})? "
                 f"{escape(v['evidence'])}" for v in verdicts]]
    return Section("B vs A per category", {"rows": rows, "verdicts": verdicts}, md if compared else None,
                   console if compared else [])


def identity_section(requests: Sequence[dict], compared: bool) -> Section:
    idents = [r["identity"] for r in requests if r.get("identity")]
    diverged = [r for r in requests if r.get("identity") and not r["identity"]["identical"]]
    ident = {"compared": len(idents), "identical": sum(1 for i in idents if i["identical"]),
             "divergences": [{"request_id": r["request_id"], "category": r["category"],
                              "prompt_index": r["prompt_index"], **r["identity"]} for r in diverged]}
    md = [f"{ident['identical']}/{ident['compared']} outputs of B identical to A's (text)."
          if ident["compared"] else "No T=0 pairs compared."]
    md += [f"- {d['category']} #{d['prompt_index']} ({d['request_id']}): first difference at character "
           f"{d['first_divergence_char']} ({d['a_tokens']} vs {d['b_tokens']} tokens)" for d in ident["divergences"]]
    return Section("Output identity at T=0", {"identity": ident}, md if compared else None)


def latency_section(requests: Sequence[dict]) -> Section:
    rows = latency_rows(requests)
    lat = [(r["endpoint"], r["category"], f"{r['temperature']:g}", str(r["requests"]), f"{r['tokens_per_s']:.1f}",
            quantiles(r["ttft_ms"], ".1f"), quantiles(r["tpot_ms"], ".1f"), quantiles(r["itl_ms"], ".1f"))
           for r in rows]
    md = ["TTFT: request → first content; per-token: (last − first content) / (tokens − 1); ITL: gaps between "
          "streamed deltas (a delta carrying a speculative round's tokens is one gap).", "",
          md_table(("endpoint", "category", "T", "requests", "tok/s", "TTFT p50/p95/p99", "per-token p50/p95/p99",
                    "ITL p50/p95/p99"), lat)]
    console = [f"{r['endpoint']} {escape(r['category'])} T={r['temperature']:g}: {r['tokens_per_s']:.1f} tok/s, "
               f"TTFT p50/p95/p99 {quantiles(r['ttft_ms'], '.1f')} ms, ITL {quantiles(r['itl_ms'], '.1f')} ms"
               for r in rows]
    return Section("Latency per endpoint (ms, client side)", {"latency": rows}, md, console)


def _sent(row: dict) -> str:
    return "REPLAY" if row.get("replay") else "fresh"


def phases_section(phases: Sequence[Phase]) -> Section:
    """What each phase sent, and whether its server had been sent it before (trust/phases.py)."""
    def spans(prompts) -> str:
        cats = dict.fromkeys(p.category for p in prompts)
        idx = {c: [p.index for p in prompts if p.category == c] for c in cats}
        return ", ".join(f"{c} {i[0]}" + (f"–{i[-1]}" if len(i) > 1 else "") for c, i in idx.items())
    body = [(p.name, spans(p.prompts), "REPLAY" if p.replay else "fresh") for p in phases]
    md = ["A server keeps what it is sent (a prompt cache, speclm's suffix cache): a prompt sent to it again is "
          "timed replaying its first answer. Each phase sends prompts of its own when every category has a "
          f"prompt per phase ({len(phases)} here); otherwise every phase sends the whole set, and each phase "
          "after the first is a REPLAY. A concurrency row keeps at most as many requests in flight as it has "
          "prompts.", "", md_table(("phase", "prompts", "sent before"), body)]
    return Section("Prompts per phase", {"phases": [p.to_dict() for p in phases]}, md)


def concurrency_section(rows: list[dict]) -> Section:
    phase_at = {p: i for i, p in enumerate(dict.fromkeys(c["phase"] for c in rows))}
    shown = sorted(rows, key=lambda c: (phase_at[c["phase"]], c["endpoint"]))  # measured alternating (run.py)
    conc = [(c["endpoint"], n_cell(c), str(c.get("in_flight_peak", "-")), _sent(c), f"{c['temperature']:g}",
             str(c["requests"]), _went(c), f"{c['throughput_tok_s']:.1f}", quantiles(c["latency_ms"], ".1f"),
             quantiles(c["ttft_ms"], ".1f"), quantiles(c["itl_ms"], ".1f")) for c in shown]
    pairs = b_over_a(rows)
    md = ["N closed-loop clients, each of the row's prompts once; in flight: the most requests the row had in "
          "flight at once; prompts: fresh, or a REPLAY of prompts the server was sent before (Prompts per phase); "
          "went: first or second of the row's two servers (who goes first alternates from row to row).",
          "", md_table(("endpoint", "N", "in flight", "prompts", "T", "requests", "went", "tok/s",
                        "latency p50/p95/p99", "TTFT p50/p95/p99", "ITL p50/p95/p99"), conc)]
    if pairs:
        md += ["", "B ÷ A per row (one run of each row: the same code moves a few per cent from run to run).", "",
               md_table(("N", "T", "B ÷ A tok/s", "TTFT p95 A / B ms", "first"), [
                   (p["n"], f"{p['temperature']:g}", f"{p['ratio']:.3f}×",
                    f"{p['ttft_p95_ms']['A']:.0f} / {p['ttft_p95_ms']['B']:.0f}", p["first"]) for p in pairs])]
    console = [f"{c['endpoint']} N={n_cell(c)}{' [bold]REPLAY[/]' if c.get('replay') else ''}: "
               f"{c['throughput_tok_s']:.1f} tok/s" for c in shown]
    console += [f"B ÷ A N={p['n']}: {p['ratio']:.3f}× tok/s ({p['first']} first)" for p in pairs]
    return Section("Throughput under concurrency", {"concurrency": rows, "b_over_a": pairs}, md if rows else None,
                   console)


def b_over_a(rows: list[dict]) -> list[dict]:
    """Per row that both servers ran: B's aggregate tok/s over A's, their TTFT p95, who went first."""
    by_phase: dict[str, dict[str, dict]] = {}
    for c in rows:
        by_phase.setdefault(c["phase"], {})[c["endpoint"]] = c
    out = []
    for pair in by_phase.values():
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None or not a["throughput_tok_s"]:
            continue
        out.append({"n": n_cell(a), "temperature": a["temperature"],
                    "ratio": b["throughput_tok_s"] / a["throughput_tok_s"],
                    "ttft_p95_ms": {"A": a["ttft_ms"]["p95"], "B": b["ttft_ms"]["p95"]},
                    "first": "A" if a["position"] == 1 else "B"})
    return out


def _went(row: dict) -> str:
    return ("first", "second")[row["position"] - 1]


def speculation_section(endpoints: Sequence[dict]) -> Section:
    md = ["Counter differences over this run (other traffic to the server included).", "",
          md_table(("endpoint", "source", "drafted", "accepted", "acceptance rate", "mean acceptance length",
                    "per-position acceptance"), _spec_rows(endpoints)), ""]
    console = [f"{e['label']} /metrics ({s['source']}): acceptance rate {s['acceptance_rate']:.3f}, "
               f"mean acceptance length {s['mean_acceptance_length'] or 0:.2f}"
               for e in endpoints if (s := e["speculation"]).get("source") and s.get("acceptance_rate") is not None]
    return Section("Speculation metrics (the servers' /metrics, after − before)", markdown=md, console=console)


def endpoint_sections(run: EndpointRun, config: dict, quiet: dict | None, manifest: dict,
                      warnings: Sequence[str], phases: Sequence[Phase]) -> list[Section]:
    """The report of `run`, in report.md's order; `phases` are what it planned to send."""
    header = header_section(run, config, quiet, manifest)
    compared = len(run.endpoints) > 1
    error = [f"> **PARTIAL RESULTS**: the run stopped: {run.error}"] if run.error else None
    return [header, Section(None, markdown=error), warnings_section(warnings),
            b_vs_a_section(group_rows([as_bench(r) for r in run.requests]), run.requests, compared),
            identity_section(run.requests, compared), phases_section(phases), latency_section(run.requests),
            concurrency_section(run.concurrency), speculation_section(header.data["endpoints"])]
