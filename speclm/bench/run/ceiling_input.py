"""What the copy ceiling (analysis/ceiling.py) needs of one target, measured while it is
loaded: each category's v(1..ceiling_k + 1) after as many tokens as its average round
sees, the prompts' predictions as the target's tokens, and those tokens' bytes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ...api import LLM
from ...costs import time_curve
from ..analysis import ceiling
from ..setup.plan import BenchPlan


def ceiling_input(llm: LLM, plan: BenchPlan, requests: Sequence[dict],
                  encoded: Sequence[list[int]]) -> ceiling.CeilingInput | None:
    """One target's copy-ceiling input (curves: median of ceiling.REPEATS); None without
    greedy AR records."""
    ar = ceiling.greedy_ar(requests)
    if not ar:
        return None
    ids: dict[tuple[str, int], list[int]] = dict(zip(((p.category, p.index) for p in plan.prompts), encoded))
    timed = {cat: time_curve(llm.target, range(1, plan.ceiling_k + 2),
                             ceiling.timing_context([r for r in ar if r["category"] == cat], ids),
                             repeats=ceiling.REPEATS, statistic=statistics.median)
             for cat in dict.fromkeys(r["category"] for r in ar)}
    predictions = {(p.category, p.index): llm.prediction_ids(p.prediction, "suffix", plan.cfg.base)
                   for p in plan.prompts if p.prediction is not None}
    tokens = {t for seq in [*ids.values(), *predictions.values(), *(r["token_ids"] for r in ar)] for t in seq}
    return ceiling.CeilingInput(ar[0].get("target_name"), ar, ids, timed, predictions,
                                {t: llm.target.token_bytes(t) for t in tokens})
