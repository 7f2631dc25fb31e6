"""The "Medusa heads" section of report.md: per-head acceptance, the heads' own
cost per round, and the online learning curve (acceptance per 100 rounds, in
run order, over a category's requests)."""

from __future__ import annotations

from collections.abc import Sequence

from .tables import md_table

CURVE_ROUNDS = 100


def heads_counts(rounds) -> dict:
    """Per request: rounds drafted by heads, their ms, online-learning ms and each
    round's (proposed, accepted) for the learning curve ({} for other proposers)."""
    heads = [r for r in rounds if r.info and "heads_ms" in r.info]
    if not heads:
        return {}
    return {"heads_rounds": len(heads), "heads_ms": sum(r.info["heads_ms"] for r in heads),
            "learn_ms": sum(r.info.get("learn_ms", 0.0) for r in heads),
            "round_pa": [[r.proposed, r.accepted] for r in rounds]}


def curve(recs: Sequence[dict], block: int = CURVE_ROUNDS) -> list[float]:
    """Acceptance rate (accepted / proposed) of each block of `block` consecutive drafting rounds."""
    pa = [(p, a) for r in recs for p, a in r.get("round_pa", []) if p > 0]
    out = []
    for s in range(0, len(pa) - block + 1, block):
        chunk = pa[s:s + block]
        out.append(sum(a for _, a in chunk) / sum(p for p, _ in chunk))
    return out


def heads_rows(requests: Sequence[dict]) -> list[dict]:
    from .report import GROUP_KEYS
    groups: dict[tuple, list[dict]] = {}
    for r in requests:
        if r.get("heads_rounds"):
            groups.setdefault(tuple(r.get(k) for k in GROUP_KEYS), []).append(r)
    rows = []
    for key, recs in groups.items():
        n = sum(r["heads_rounds"] for r in recs)
        rows.append({**dict(zip(GROUP_KEYS, key)), "rounds": n, "heads_ms_per_round": sum(r["heads_ms"] for r in recs) / n,
                     "learn_ms_per_round": sum(r["learn_ms"] for r in recs) / n, "curve": curve(recs)})
    return rows


def render(rows: Sequence[dict], main_rows: Sequence[dict]) -> list[str]:
    if not rows:
        return []
    from .report import GROUP_KEYS, _f, label
    main = {tuple(r.get(k) for k in GROUP_KEYS): r for r in main_rows}
    body = []
    for r in rows:
        m = main.get(tuple(r.get(k) for k in GROUP_KEYS), {})
        body.append((r["category"], label(r), f"{r['temperature']:g}", str(r["rounds"]),
                     " ".join(f"{x:.2f}" for x in m.get("per_position_acceptance") or []),
                     _f(m.get("mean_acceptance_length")), f"{r['heads_ms_per_round']:.2f}",
                     f"{r['learn_ms_per_round']:.2f}", " ".join(f"{x:.2f}" for x in r["curve"]) or "-"))
    return ["", "## Medusa heads", "",
            f"Head j's acceptance is the per-position acceptance at j. Heads ms: drafting (all heads, one hidden "
            f"state) per round; learn ms: online adaptation per round (0 without --heads-online). Curve: "
            f"acceptance rate of each {CURVE_ROUNDS} consecutive drafting rounds, in run order.", "",
            md_table(("category", "method", "T", "rounds", "acceptance head 1..K", "mean acc len", "heads ms",
                      "learn ms", f"acceptance per {CURVE_ROUNDS} rounds"), body)]
