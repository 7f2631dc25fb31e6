"""Medusa heads per group of requests: the heads' own cost per round, the online
learning curve (acceptance per 100 drafting rounds, in run order) and per-head
acceptance (the group row's per-position acceptance)."""

from __future__ import annotations

from collections.abc import Sequence

from .groups import GROUP_KEYS, label

CURVE_ROUNDS = 100


def curve(recs: Sequence[dict], block: int = CURVE_ROUNDS) -> list[float]:
    """Acceptance rate (accepted / proposed) of each block of `block` consecutive drafting rounds."""
    pa = [(p, a) for r in recs for p, a in r.get("round_pa", []) if p > 0]
    out = []
    for s in range(0, len(pa) - block + 1, block):
        chunk = pa[s:s + block]
        out.append(sum(a for _, a in chunk) / sum(p for p, _ in chunk))
    return out


def heads_rows(requests: Sequence[dict], rows: Sequence[dict]) -> list[dict]:
    """summary["medusa"]: per group with head-drafted rounds, its label, ms, learn ms, curve
    (over `curve_rounds` rounds a point) and, from its group row in `rows`, the per-head
    (per-position) acceptance and mean acceptance length."""
    by_group = {tuple(r.get(k) for k in GROUP_KEYS): r for r in rows}
    groups: dict[tuple, list[dict]] = {}
    for r in requests:
        if r.get("heads_rounds"):
            groups.setdefault(tuple(r.get(k) for k in GROUP_KEYS), []).append(r)
    out = []
    for key, recs in groups.items():
        n = sum(r["heads_rounds"] for r in recs)
        group, row = dict(zip(GROUP_KEYS, key)), by_group.get(key, {})
        out.append({**group, "label": label(group), "rounds": n,
                    "heads_ms_per_round": sum(r["heads_ms"] for r in recs) / n,
                    "learn_ms_per_round": sum(r["learn_ms"] for r in recs) / n,
                    "curve": curve(recs), "curve_rounds": CURVE_ROUNDS,
                    "per_position_acceptance": row.get("per_position_acceptance"),
                    "mean_acceptance_length": row.get("mean_acceptance_length")})
    return out
