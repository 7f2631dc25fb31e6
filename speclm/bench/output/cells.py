"""The cells every report table is written with: markdown tables, numbers, ratios,
distributions and sizes ('-' wherever a value is missing)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def num(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def wall_cell(row: dict) -> str:
    """'1.25× [4/4]': the Σ-wall ratio over the pairs of equal length, and how many those are."""
    return f"{fmt_x(row.get('wall_speedup'))} [{row.get('same_length', 0)}/{row.get('pairs', 0)}]"


def identity_cell(row: dict) -> str:
    ident = row.get("identity")
    return "-" if not ident else f"{ident['identical']}/{ident['compared']}"


def quantiles(d: dict, spec: str = ".0f") -> str:
    """'p50 / p95 / p99' of a distribution."""
    return " / ".join(num(d[q], spec) for q in ("p50", "p95", "p99"))


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"
