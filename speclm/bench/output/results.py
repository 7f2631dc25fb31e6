"""The sections on the group rows (analysis/groups.py, each with its label): the verdicts,
the main table of speedups, the latency distributions, per-position acceptance and
greedy identity."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from ..setup.methods import BASELINE
from .cells import fmt_x, identity_cell, md_table, num, quantiles, wall_cell
from .sections import Section

MAIN_HEADER = ("category", "method", "T", "speedup", "p50 [min–max]", "faster", "decode/tok", "prefill/tok",
               "Σ wall [same len]", "identical", "acc rate", "mean acc len", "tok/s")
RATIOS_NOTE = ("speedup = AR time per output token / method time per output token over the same prompts in "
               "this run (= method tok/s / AR tok/s); p50 [min–max] over per-pair ratios; decode/tok: the same "
               "with prefill taken out; prefill/tok: AR prefill per prompt token / the method's; Σ wall: Σ AR "
               "wall / Σ method wall over the pairs whose output lengths match [matching/all]; identical: "
               "greedy outputs identical to AR [identical/compared].")


def identity_note(verdict: dict) -> str:
    """'; greedy output identical to AR 3/4' for a verdict with identity counts, else ''."""
    ident = verdict.get("identity")
    return f"; greedy output identical to AR {ident['identical']}/{ident['compared']}" if ident else ""


def verdicts_section(verdicts: list[dict], busy: bool) -> Section:
    several = len({v.get("target") for v in verdicts}) > 1

    def on(v: dict, quote: str) -> str:
        return f" on {quote}{v.get('target_name') or v.get('target')}{quote}" if several else ""
    md = ["_The machine was busy (see the warning above): these verdicts rest on noisy timings._", ""] if busy else []
    md += [f"- **{v['category']}**{on(v, '`')} (T={v['temperature']:g}, {v['max_new_tokens']} tokens): "
           f"{v['evidence']}{identity_note(v)}" for v in verdicts]
    console = [f"enable speculation for [bold]{escape(v['category'])}[/]{escape(on(v, ''))} "
               f"(T={v['temperature']:g})? {escape(v['evidence'] + identity_note(v))}" for v in verdicts]
    return Section("Enable speculation here?", {"verdicts": verdicts}, md, console)


def table_rows(rows: Sequence[dict], max_new_tokens: Sequence[int]) -> list[tuple[str, ...]]:
    """The main table: one line per category × method × K × T (× max_new_tokens)."""
    out = []
    for r in rows:
        d = r["speedup_dist"]
        base = r["method"] == BASELINE
        out.append((r["category"] + ("" if len(max_new_tokens) < 2 else f" N={r['max_new_tokens']}"),
                    r["label"], f"{r['temperature']:g}", "1.00× (base)" if base else fmt_x(r["speedup"]),
                    "-" if base else f"{num(d['p50'])} [{num(d['min'])}–{num(d['max'])}]",
                    "-" if base else f"{r['prompts_faster']}/{r['prompts']}",
                    *(("-",) * 3 if base else (fmt_x(r.get("decode_speedup")), fmt_x(r.get("prefill_speedup")),
                                               wall_cell(r))),
                    identity_cell(r), num(r["acceptance_rate"], ".3f"), num(r["mean_acceptance_length"]),
                    num(r["tokens_per_s"], ".1f")))
    return out


def console_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A rich table of `rows`, the first two columns left-aligned."""
    table = Table(title=title)
    for i, name in enumerate(header):
        table.add_column(escape(name), justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*map(escape, row))
    return table


def results_section(rows: list[dict], max_new_tokens: Sequence[int]) -> Section:
    body = table_rows(rows, max_new_tokens)
    return Section("Results", {"rows": rows}, [RATIOS_NOTE, "", md_table(MAIN_HEADER, body)],
                   [console_table("speclm bench: speedup vs AR (same prompts, same run)", MAIN_HEADER, body)])


def distributions_section(rows: Sequence[dict]) -> Section:
    body = [(r["category"], r["label"], f"{r['temperature']:g}",
             *(quantiles(r[key]) for key in ("latency_ms", "ttft_ms", "tpot_ms")),
             f"{r['draft_share']:.0%} / {r['verify_share']:.0%}") for r in rows]
    return Section("Distributions (ms)", markdown=[md_table(
        ("category", "method", "T", "latency p50/p95/p99", "TTFT p50/p95/p99", "TPOT p50/p95/p99",
         "draft / verify share"), body)])


def acceptance_section(rows: Sequence[dict]) -> Section:
    body = [(r["category"], r["label"], f"{r['temperature']:g}",
             " ".join(f"{x:.2f}" for x in r["per_position_acceptance"]),
             " ".join(str(x) for x in r["counts"]["rejection_hist"]), str(r["counts"]["full_accepts"]))
            for r in rows if r["method"] != BASELINE]
    return Section("Per-position acceptance and rejections", markdown=[md_table(
        ("category", "method", "T", "acceptance at j=1..K", "rejections at j=1..K", "all accepted"), body)])


def identity_section(divergences: list[dict]) -> Section:
    md = ["All greedy outputs identical to AR." if not divergences else
          "Differences (a tiny AR top-1/top-2 margin points at batch numerics, a large one at a bug):"]
    md += [f"- {d['category']} #{d['prompt_index']} {d['label']}: token {d['first_divergence']}, "
           f"margin {num(d['ar_top2_margin'], '.4f')}" for d in divergences]
    return Section("Greedy identity with AR", {"identity_divergences": divergences}, md)
