"""The "variants" section of a targets × drafts sweep (run/models.py): per target × draft,
the target's AR tok/s and v(k), the draft config with the most accepted progress per ms
(Σ output tokens / Σ wall ms, docs/design.md#metrics) and its speedup over its own
target's AR, and the best pair with its perplexity cost against the first target."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..setup.methods import BASELINE
from .groups import label
from .quality import CONTEXT, V_KS, V_REPEATS
from .ratios import pair_with_ar, speedup_stats


def _tok_s(recs: Sequence[dict]) -> float | None:
    wall = sum(r["wall_ms"] for r in recs)
    return 1000.0 * sum(r["output_tokens"] for r in recs) / wall if wall > 0 else None


def variant_rows(requests: Sequence[dict], targets: Sequence[dict], drafts: Sequence[dict]) -> list[dict]:
    """One row per target × draft (per target when no draft ran): the target's AR tok/s
    and v(k), and the draft config (method, K) with the most accepted progress per ms
    (Σ output tokens / Σ wall ms, speclm.metrics' definition, with its label) and its
    speedup vs AR."""
    rows = []
    for t in targets:
        mine = [r for r in requests if r.get("target_name") == t["name"]]
        pairs = pair_with_ar(mine)
        for d in drafts or [None]:
            configs: dict[tuple, list[dict]] = defaultdict(list)
            for r in mine:
                if r["method"] != BASELINE and (d is None or r.get("draft_name") == d["name"]):
                    configs[(r["method"], r["k"])].append(r)
            by_config = []
            for (method, k), recs in configs.items():
                ids = {id(r) for r in recs}
                sp = speedup_stats([(m, a) for m, a in pairs if id(m) in ids])
                tok_s = _tok_s(recs)
                by_config.append({"method": method, "k": k, "tok_s": tok_s, "speedup": sp["speedup"],
                                  "decode_speedup": sp["decode_speedup"],
                                  "accepted_progress_per_ms": None if tok_s is None else tok_s / 1000.0})
            best = max(by_config, key=lambda c: c["tok_s"] or 0.0, default=None)
            rows.append({"target": t["name"], "target_file": t["file"], "target_size": t["size"],
                         "draft": d and d["name"], "draft_file": d and d["file"], "draft_size": d and d["size"],
                         "target_perplexity": t["perplexity"], "draft_perplexity": d and d["perplexity"],
                         "agreement": t["agreement"], "ar_tok_s": _tok_s([r for r in mine if r["method"] == BASELINE]),
                         "v_ms": t["v_ms"],
                         "best": best and {"method": best["method"], "k": best["k"], "label": label(best)},
                         "sd_tok_s": best and best["tok_s"], "speedup": best and best["speedup"],
                         "accepted_progress_per_ms": best and best["accepted_progress_per_ms"],
                         "by_config": by_config})
    return rows


def best_pair(rows: Sequence[dict], reference: dict) -> tuple[dict | None, str]:
    """(the row with the most accepted progress per ms, a sentence naming it and its
    perplexity cost against the reference (shipped) target)."""
    cands = [r for r in rows if r["accepted_progress_per_ms"] is not None]
    if not cands:
        return None, "No speculative method ran: no pair to name."
    b = max(cands, key=lambda r: r["accepted_progress_per_ms"])
    pair = b["target"] + (f" + draft {b['draft']}" if b["draft"] else "")
    out = {"target": b["target"], "draft": b["draft"], **b["best"],
           "accepted_progress_per_ms": b["accepted_progress_per_ms"], "perplexity": b["target_perplexity"],
           "reference": reference["name"], "reference_perplexity": reference["perplexity"],
           "perplexity_cost": None, "perplexity_cost_pct": None}
    text = (f"Best pair by accepted progress per ms: {pair} ({b['best']['method']} K={b['best']['k']}), "
            f"{b['accepted_progress_per_ms']:.4f} tokens/ms ({b['sd_tok_s']:.1f} tok/s, "
            f"{b['speedup']:.2f}× its own AR). ")
    if b["target_perplexity"] is None or reference["perplexity"] is None:
        text += "Perplexity cost not measured: rerun with --variant-quality."
    elif b["target"] == reference["name"]:
        out.update(perplexity_cost=0.0, perplexity_cost_pct=0.0)
        text += f"It keeps the shipped target (perplexity {reference['perplexity']:.3f}): no perplexity cost."
    else:
        cost = b["target_perplexity"] - reference["perplexity"]
        out.update(perplexity_cost=cost, perplexity_cost_pct=100.0 * cost / reference["perplexity"])
        text += (f"Perplexity {b['target_perplexity']:.3f} vs {reference['perplexity']:.3f} for the shipped "
                 f"{reference['name']} ({cost:+.3f}, {out['perplexity_cost_pct']:+.1f}%).")
    fastest_ar = max(rows, key=lambda r: r["ar_tok_s"] or 0.0)
    if fastest_ar["ar_tok_s"] and fastest_ar["ar_tok_s"] > (b["sd_tok_s"] or 0.0):
        text += f" Plain decoding of {fastest_ar['target']} is faster still ({fastest_ar['ar_tok_s']:.1f} tok/s)."
    return out, text


def build_variants(requests: Sequence[dict], targets: list[dict], drafts: list[dict], *, quality: bool,
                   text_labels: list[str]) -> dict:
    """summary.json's "variants" section."""
    rows = variant_rows(requests, targets, drafts)
    best, sentence = best_pair(rows, targets[0])
    return {"reference": targets[0]["name"], "ks": list(V_KS), "v_repeats": V_REPEATS,
            "v_context_tokens": CONTEXT, "quality": quality,
            "texts": text_labels if quality else None,
            "targets": targets, "drafts": drafts,
            "rows": rows, "best": best, "best_sentence": sentence}
