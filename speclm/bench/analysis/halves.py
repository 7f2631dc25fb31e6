"""First half vs second half of each category's prompts: does a method get
better as a category's sequence runs (a cross-request cache learning it)?

A category's prompts run as a sequence, in index order (run/sequential.run_order).
With n distinct prompt indices, half 1 is the first n // 2 of them and half 2
the rest (an odd one out goes to half 2); a category with fewer than 2
prompts has no halves. Each half's figures are groups.group_rows over that
half's requests alone, every repeat included: speedup = Σ AR wall / Σ method
wall over the half's (prompt, repeat) pairs, acceptance over its rounds.
The halves hold different prompts, so part of any difference is theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..setup.methods import BASELINE
from .groups import GROUP_KEYS, group_rows, labelled

FIELDS = ("requests", "prompts", "speedup", "decode_speedup", "acceptance_rate", "mean_acceptance_length",
          "tokens_per_s")


def split(indices: Sequence[int]) -> tuple[list[int], list[int]]:
    """(first n // 2, rest) of the distinct indices in ascending order."""
    idx = sorted(set(indices))
    return idx[:len(idx) // 2], idx[len(idx) // 2:]


def halves(requests: Sequence[dict]) -> list[dict]:
    """summary["halves"]: per category × method config (AR excluded) × half (1, 2), that
    half's prompt indices, speedup and acceptance, labelled (groups.labelled); categories
    with < 2 prompts are left out."""
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
    return labelled(rows)
