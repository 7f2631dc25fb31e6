"""The "Concurrency" section: every row of N closed-loop clients, then the ratios of rows
run back to back within a repeat (analysis/scaling.py), each labelled by the analyse
stage. A row's N is never more than its prompts (trust/phases.py); the N asked for
stands beside it when it was more."""

from __future__ import annotations

from collections.abc import Sequence

from ..setup.methods import BASELINE
from .cells import md_table, num, quantiles
from .sections import Section


def n_cell(row: dict) -> str:
    """'4', or '3 (16 asked)' for a row capped at the prompts it had."""
    asked = row.get("concurrency_requested") or row["concurrency"]
    return str(row["concurrency"]) + (f" ({asked} asked)" if asked != row["concurrency"] else "")


def _spread(s: dict | None, unit: str = "×", spec: str = ".2f") -> str:
    if s is None:
        return "-"
    if s["n"] == 1:
        return f"{s['p50']:{spec}}{unit}"
    return f"{s['p50']:{spec}}{unit} [{s['min']:{spec}}–{s['max']:{spec}}]"


def paired_table(entries: Sequence[dict]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The paired ratios' header and rows (each entry's label names its config)."""
    header = ("N", "method", "T", "repeats", "tok/s median [min–max]", "vs AR at this N", "below AR",
              "vs AR at N=1")
    rows = [(n_cell(e), e["label"], f"{e['temperature']:g}",
             str(e["repeats"]) + (f" ({e['starved']} starved)" if e["starved"] else ""),
             _spread(e["tok_s"], "", ".1f"), _spread(e["vs_ar"]) if e["method"] != BASELINE else "(base)",
             f"{e['below_ar']}/{e['vs_ar']['n']}" if e["vs_ar"] else "-", _spread(e["vs_ar_1"]))
            for e in entries]
    return header, rows


def concurrency_section(rows: list[dict], paired: list[dict]) -> Section:
    if not rows:
        return Section("Concurrency", {"concurrency": rows, "concurrency_paired": paired})
    repeats = max(c.get("repeat", 0) for c in rows) + 1
    body = [(n_cell(c), str(c.get("in_flight_peak", "-")), c["label"], f"{c['temperature']:g}",
             *([str(c.get("repeat", 0) + 1)] if repeats > 1 else []), num(c["throughput_tok_s"], ".1f"),
             *(quantiles(c[key]) for key in ("latency_ms", "ttft_ms", "ttft_first_wave_ms", "ttft_steady_ms")),
             str(c["ttft_steady_ms"]["n"])) for c in rows]
    header, paired_rows = paired_table(paired)
    md = ["N closed-loop clients over every prompt. First wave: the first N requests, arriving together; steady: "
          "the later ones, each arriving while the others decode. A row keeps at most as many requests in flight as "
          "it has prompts; in flight: the most it had at once."
          + (" Rows in run order; each repeat is a pass over every N, AR and the methods alternating "
             "who runs first." if repeats > 1 else ""), "",
          md_table(("N", "in flight", "method", "T", *(["repeat"] if repeats > 1 else []), "tok/s",
                    "latency p50/p95/p99", "TTFT p50/p95/p99", "TTFT first wave p50/p95/p99",
                    "TTFT steady p50/p95/p99", "steady n"), body),
          "", "Ratios within a repeat (rows run back to back, so machine drift falls on both): "
          "median [min–max] over the repeats; below AR counts the repeats in which the method's "
          "throughput was lower than AR's at the same N.", "", md_table(header, paired_rows)]
    return Section("Concurrency", {"concurrency": rows, "concurrency_paired": paired}, md)
