"""SSD on its own hardware: a PROJECTION from costs measured in the same run.

On one machine SSD must split the cores: the target verifies with fewer
threads while the speculator drafts on the rest, so the measured SSD figure
answers "SSD on this machine". The question "what if the speculator had its
own hardware, equal to the target's?" is answered here, from measured parts:

    round_ssd = v + o + h·w_hit + (1 − h)·K̄·d      tok/s_ssd = L_ssd / round_ssd
    round_sd  = v + o + K̄_sd·d                     tok/s_sd  = L_sd / round_sd

SD is serial, so its own hardware for the draft changes nothing; it is modelled
from the same parts so the ratio compares like with like (the measured sd-draft
decode rate also pays the draft's prompt prefill in its first round).

v, o: the sd-draft rows' verify and other ms per round at the same K (the
target on the full machine); d: their draft ms per token after the first round
(whose drafting includes the draft's prompt prefill), what a miss costs; h, w_hit, K̄, L_ssd: the ssd rows' cache hit rate,
wait for a block on a hit, mean block length and mean acceptance length.
It assumes the speculator keeps the hit rate it had on its share of this
machine, and that the verifier's wait on a hit is what it was here. Prefill
is excluded on every side (decode tok/s = tokens after the prefill / (wall − prefill)).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ...costs import round_cost
from ...speculative.methods import METHODS as TABLE
from .counts import merge_counts
from .ratios import decode_tokens


def _decode_tok_s(recs: Sequence[dict]) -> float | None:
    ms = sum(r["wall_ms"] - r.get("prefill_ms", 0.0) for r in recs)
    return 1000.0 * sum(decode_tokens(r) for r in recs) / ms if ms > 0 else None


def project(requests: Sequence[dict]) -> list[dict]:
    """One row per category (and 'all') × target × T × K with requests of both a
    speculator method (ssd) and its synchronous twin (the table's `sync_twin`: sd-draft)."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    cats = list(dict.fromkeys(r["category"] for r in requests))
    for r in requests:
        for cat in ([r["category"], "all"] if len(cats) > 1 else [r["category"]]):
            key = (cat, r.get("target_name"), r["temperature"], r["max_new_tokens"])
            groups[key][(r["method"], r["k"], r.get("draft_name"))].append(r)
    rows = []
    for (cat, target, temp, max_new), by in groups.items():
        for (method, k, draft), ssd in by.items():
            twin = TABLE[method].sync_twin if method in TABLE else None
            sd = by.get((twin, k, draft)) if twin else None
            if not sd or not any(r.get("cache_rounds") for r in ssd):
                continue
            c_sd, c_ssd = merge_counts(sd), merge_counts(ssd)
            v = sum(r["verify_ms"] for r in sd) / max(1, c_sd["rounds"] - sum(r.get("prompt_rounds", 0) for r in sd))
            o = sum(r["other_ms"] for r in sd) / c_sd["rounds"]
            d = (sum(r["draft_ms"] - r.get("first_round_draft_ms", 0.0) for r in sd)
                 / max(1, c_sd["proposed"] - sum(r.get("first_round_proposed", 0) for r in sd)))
            n = sum(r["cache_rounds"] for r in ssd)
            hits = sum(r["cache_hits"] for r in ssd)
            h = hits / n
            w_hit = sum(r.get("speculator_wait_hit_ms", 0.0) for r in ssd) / hits if hits else 0.0
            k_bar = c_ssd["proposed"] / c_ssd["rounds"]
            length = c_ssd["emitted"] / c_ssd["rounds"]
            # a hit waits w_hit for its block, a miss drafts K̄ tokens serially at d each
            round_ms = round_cost((1 - h) * k_bar, d, v, o + h * w_hit)
            projected = 1000.0 * length / round_ms
            sd_round_ms = round_cost(c_sd["proposed"] / c_sd["rounds"], d, v, o)
            sd_model = 1000.0 * (c_sd["emitted"] / c_sd["rounds"]) / sd_round_ms
            ar = _decode_tok_s(next((recs for (m, _, _), recs in by.items() if m == "ar"), []))
            sd_tok_s = _decode_tok_s(sd)
            rows.append({"category": cat, "target_name": target, "draft_name": draft, "temperature": temp,
                         "max_new_tokens": max_new, "k": k, "ar_decode_tok_s": ar, "sd_decode_tok_s": sd_tok_s,
                         "ssd_decode_tok_s_measured": _decode_tok_s(ssd),
                         "ssd_decode_tok_s_projected": projected, "sd_decode_tok_s_modelled": sd_model,
                         "projected_vs_sd": projected / sd_model,
                         "projected_vs_ar": projected / ar if ar else None,
                         "inputs": {"verify_ms_per_round": v, "other_ms_per_round": o, "draft_ms_per_token": d,
                                    "hit_rate": h, "wait_ms_on_hit": w_hit, "mean_block": k_bar,
                                    "mean_acceptance_length_ssd": length,
                                    "mean_acceptance_length_sd": c_sd["emitted"] / c_sd["rounds"]}})
    return rows
