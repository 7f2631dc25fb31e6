"""First half vs second half of each category's prompts: does a method get
better as a category's sequence runs (a cross-request cache learning it)?

A category's prompts run as a sequence, in index order (runner.run_order).
With n distinct prompt indices, half 1 is the first n // 2 of them and half 2
the rest (an odd one out goes to half 2); a category with fewer than 2
prompts has no halves. Each half's figures are report.group_rows over that
half's requests alone, every repeat included: speedup = Σ AR wall / Σ method
wall over the half's (prompt, repeat) pairs, acceptance over its rounds.
The halves hold different prompts, so part of any difference is theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

from .setup.methods import BASELINE
from .tables import md_table

FIELDS = ("requests", "prompts", "speedup", "decode_speedup", "acceptance_rate", "mean_acceptance_length",
          "tokens_per_s")


def split(indices: Sequence[int]) -> tuple[list[int], list[int]]:
    """(first n // 2, rest) of the distinct indices in ascending order."""
    idx = sorted(set(indices))
    return idx[:len(idx) // 2], idx[len(idx) // 2:]


def halves(requests: Sequence[dict]) -> list[dict]:
    """summary["halves"]: per category × method config (AR excluded) × half (1, 2), that
    half's prompt indices, speedup and acceptance; categories with < 2 prompts are left out."""
    from .report import GROUP_KEYS, group_rows
    rows = []
    for cat in dict.fromkeys(r["category"] for r in requests):
        recs = [r for r in requests if r["category"] == cat]
        parts = split([r["prompt_index"] for r in recs])
        if not parts[0]:
            continue
        for half, indices in enumerate(parts, 1):
            chosen = set(indices)
            for g in group_rows([r for r in recs if r["prompt_index"] in chosen], overall=False):
                if g["method"] == BASELINE:
                    continue
                names = {n: g[n] for n in ("target_name", "draft_name") if n in g}
                rows.append({**{k: g[k] for k in GROUP_KEYS}, **names, "half": half, "prompt_indices": indices,
                             **{k: g[k] for k in FIELDS}})
    return rows


def _f(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def render(rows: Sequence[dict]) -> list[str]:
    """The "First half vs second half" section of report.md (empty without halves)."""
    if not rows:
        return []
    from .report import GROUP_KEYS, label, models_vary
    models = models_vary(rows)
    several_n = len({r["max_new_tokens"] for r in rows}) > 1
    pairs: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        pairs.setdefault(tuple(r.get(k) for k in GROUP_KEYS), {})[r["half"]] = r
    body = []
    for by_half in pairs.values():
        a, b = by_half.get(1), by_half.get(2)
        if a is None or b is None:
            continue
        span = " / ".join(f"{h['prompt_indices'][0]}–{h['prompt_indices'][-1]}" for h in (a, b))
        body.append((a["category"] + (f" N={a['max_new_tokens']}" if several_n else ""), label(a, models),
                     f"{a['temperature']:g}", span, f"{_f(a['speedup'])}× → {_f(b['speedup'])}×",
                     f"{_f(a['acceptance_rate'], '.3f')} → {_f(b['acceptance_rate'], '.3f')}",
                     f"{_f(a['mean_acceptance_length'])} → {_f(b['mean_acceptance_length'])}"))
    return ["", "## First half vs second half", "",
            "Each category's prompts run in order; half 1 is its first ⌊n/2⌋ prompts, half 2 the rest, each "
            "figure over that half's requests alone. A method that learns across requests (a shared suffix "
            "cache) should gain in the second half; the halves hold different prompts, so part of any "
            "difference is theirs.", "",
            md_table(("category", "method", "T", "prompts (1st / 2nd)", "speedup 1st → 2nd",
                      "acc rate 1st → 2nd", "mean acc len 1st → 2nd"), body)]
