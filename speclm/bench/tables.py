"""Small helpers the bench's report and projection share: markdown tables and
summed round counts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def merge_counts(counts: Iterable[dict]) -> dict:
    """Sum round_counts dicts (position lists padded to the longest)."""
    out = {"rounds": 0, "proposed": 0, "accepted": 0, "emitted": 0, "full_accepts": 0,
           "pos_eligible": [], "pos_accepted": [], "rejection_hist": []}
    for c in counts:
        for key in ("rounds", "proposed", "accepted", "emitted", "full_accepts"):
            out[key] += c[key]
        for key in ("pos_eligible", "pos_accepted", "rejection_hist"):
            cur, add = out[key], c[key]
            cur.extend([0] * (len(add) - len(cur)))
            for j, v in enumerate(add):
                cur[j] += v
    return out


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
