"""Requests grouped into the report's rows (category × method × K × T × max_new_tokens ×
target × draft), the verdict per category, greedy divergences, and the labels that name
a row (docs/design.md#metrics for the figures). A variant sweep never pools models: the
target and draft a record ran on are part of its group."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..setup.methods import BASELINE, SCHEMA_BASELINE
from .counts import acceptance_from_counts, merge_counts
from .distributions import distribution
from .ratios import baseline_stats, pair_with_ar, speedup_stats, worth_it

GROUP_KEYS = ("category", "method", "k", "temperature", "max_new_tokens", "target", "draft")


# ---- names ----------------------------------------------------------------------
def short_model(name: str | None) -> str | None:
    """'qwen@q4_0' for '/cache/qwen@q4_0.gguf' or 'draft:/cache/qwen@q4_0.gguf'; None for no draft model."""
    if not name:
        return None
    path = name[len("draft:"):] if name.startswith("draft:") else name
    return Path(path).stem if path.endswith(".gguf") else path


def model_tag(row: dict) -> str:
    """'target' or 'target + draft' of a record or row (the names given, else the file stems)."""
    target = row.get("target_name") or short_model(row.get("target")) or "?"
    draft = row.get("draft_name") or ((row.get("draft") or "").startswith("draft:") and short_model(row["draft"]))
    return f"{target} + {draft}" if draft else target


def models_vary(rows: Iterable[dict]) -> bool:
    """True when some method ran on more than one target/draft pair (a variant sweep)."""
    seen: dict[str, set] = defaultdict(set)
    for r in rows:
        seen[r["method"]].add((r.get("target"), r.get("draft")))
    return any(len(pairs) > 1 for pairs in seen.values())


def label(row: dict, models: bool = False, *, k: bool = True) -> str:
    """'sd-draft K=4' ('sd-draft' without k); with models, followed by the target (+ draft) it ran on."""
    plain = not k or row["method"] in (BASELINE, SCHEMA_BASELINE) or row.get("k") is None
    base = row["method"] if plain else f"{row['method']} K={row['k']}"
    return f"{base} [{model_tag(row)}]" if models else base


def labelled(rows: Sequence[dict], models: bool | None = None) -> list[dict]:
    """`rows`, each with its "label" (label(); naming its models when `models`, by default
    when they vary among `rows`): the write stage prints these and computes none."""
    models = models_vary(rows) if models is None else models
    return [{**r, "label": label(r, models)} for r in rows]


def latencies(requests: Sequence[dict]) -> list[dict]:
    """Each request's latency with its config's label and temperature (the latency CDF's points)."""
    return [{"label": r["label"], "temperature": r["temperature"], "wall_ms": r["wall_ms"]}
            for r in labelled(requests)]


# ---- rows -----------------------------------------------------------------------
def group_row(key: tuple, recs: Sequence[dict], pairs: Sequence[tuple[dict, dict]]) -> dict:
    """One category × method × K × T × max_new_tokens row."""
    counts = merge_counts(recs)
    wall = sum(r["wall_ms"] for r in recs)
    tokens = sum(r["output_tokens"] for r in recs)
    ident = [r["identity"] for r in recs if r.get("identity") is not None]
    sp = speedup_stats(pairs) if key[1] != BASELINE else baseline_stats(recs)
    names = {n: recs[0][n] for n in ("target_name", "draft_name") if n in recs[0]}
    return {**dict(zip(GROUP_KEYS, key)), **names, "requests": len(recs), **sp, **acceptance_from_counts(counts),
            "counts": counts, "output_tokens": tokens, "wall_ms": wall,
            "tokens_per_s": 1000.0 * tokens / wall if wall > 0 else 0.0,
            "tokens_per_s_dist": distribution(r["tokens_per_s"] for r in recs),
            "latency_ms": distribution(r["wall_ms"] for r in recs),
            "ttft_ms": distribution(r["ttft_ms"] for r in recs),
            "tpot_ms": distribution(r["tpot_ms"] for r in recs),
            "draft_share": sum(r["draft_ms"] for r in recs) / wall if wall > 0 else 0.0,
            "verify_share": sum(r["verify_ms"] for r in recs) / wall if wall > 0 else 0.0,
            "identity": {"compared": len(ident), "identical": sum(1 for i in ident if i["identical"])}
            if ident else None, "ssd": ssd_stats(recs), "structured": structured_stats(recs)}


def structured_stats(recs: Sequence[dict]) -> dict | None:
    """Over requests whose prompt has a grammar: answers valid (analysis/validity.py), the
    share of output tokens the grammar forced, and the acceptance of the other drafted
    tokens; None when no prompt had one."""
    recs = [r for r in recs if "valid" in r]
    if not recs:
        return None
    out = sum(r["output_tokens"] for r in recs)
    forced = [r for r in recs if "forced_tokens" in r]
    rest = sum(r["proposed"] - r.get("forced_proposed", 0) for r in recs)
    return {"answers": len(recs), "valid": sum(bool(r["valid"]) for r in recs),
            "stopped": sum(r["finish_reason"] == "stop" for r in recs),
            "forced_share": sum(r["forced_tokens"] for r in forced) / out if forced and out else None,
            "rest_acceptance": sum(r["accepted"] - r.get("forced_accepted", 0) for r in recs) / rest if rest else None}


def ssd_stats(recs: Sequence[dict]) -> dict | None:
    """Cache hit rate (overall and by outcome k) and mean waits over SSD requests."""
    recs = [r for r in recs if r.get("cache_rounds")]
    if not recs:
        return None
    rounds = sum(r["cache_rounds"] for r in recs)
    by_k: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in recs:
        for k, (h, n) in r["cache_hits_by_k"].items():
            by_k[k][0] += h
            by_k[k][1] += n
    return {"rounds": rounds, "hit_rate": sum(r["cache_hits"] for r in recs) / rounds,
            "hit_rate_by_k": {k: h / n for k, (h, n) in sorted(by_k.items(), key=lambda kv: int(kv[0])) if n},
            "wait_ms_per_round": sum(r["speculator_wait_ms"] for r in recs) / rounds,
            "busy_ms_per_round": sum(r["speculator_busy_ms"] for r in recs) / rounds}


def group_rows(requests: Sequence[dict], overall: bool = True) -> list[dict]:
    """Rows per category (in first-seen order) and, with more than one category, 'all';
    each labelled (labelled()), with its "method_label" too (the label without K)."""
    cats = list(dict.fromkeys(r["category"] for r in requests))
    scopes = [(c, [r for r in requests if r["category"] == c]) for c in cats]
    if overall and len(cats) > 1:
        scopes.append(("all", list(requests)))
    rows = []
    for cat, recs in scopes:
        pairs = pair_with_ar(recs)
        groups: dict[tuple, list[dict]] = defaultdict(list)
        for r in recs:
            groups[(cat, *(r.get(k) for k in GROUP_KEYS[1:]))].append(r)
        for key, grp in groups.items():
            mine = [(m, a) for m, a in pairs if tuple(m.get(k) for k in GROUP_KEYS[1:]) == key[1:]]
            rows.append(group_row(key, grp, mine))
    models = models_vary(rows)
    return [{**r, "method_label": label(r, models, k=False)} for r in labelled(rows, models)]


def verdicts(rows: Sequence[dict]) -> list[dict]:
    """Per category × target × T × max_new_tokens: enable speculation iff the best config
    (by p50 speedup) has p50 > 1, total speedup > 1 and most prompts faster (ratios.worth_it);
    `identity` carries the best config's greedy identity counts; `rows` are group_rows'."""
    out = []

    def scope(r: dict) -> tuple:
        return r["category"], r.get("target"), r["temperature"], r["max_new_tokens"]
    for key in dict.fromkeys(scope(r) for r in rows):
        cat, target, temp, max_new = key
        cands = [r for r in rows if scope(r) == key and r["method"] != BASELINE and r["speedup"] is not None
                 and r["speedup_dist"]["p50"] is not None]
        if not cands:
            continue
        best = max(cands, key=lambda r: (r["speedup_dist"]["p50"], r["speedup"]))
        p50, tot, d = best["speedup_dist"]["p50"], best["speedup"], best["speedup_dist"]
        faster = f"{best['prompts_faster']}/{best['prompts']} prompts faster"
        enable = worth_it(best)
        if enable:
            evidence = (f"yes: {best['label']} {p50:.2f}× (p50; total {tot:.2f}×, "
                        f"range {d['min']:.2f}–{d['max']:.2f}×), {faster}")
        else:
            evidence = f"no: best method {best['label']} {p50:.2f}× AR (p50; total {tot:.2f}×), {faster}"
        out.append({"category": cat, "temperature": temp, "max_new_tokens": max_new, "enable": enable,
                    "best": {"method": best["method"], "k": best["k"]}, "evidence": evidence,
                    "target": target, "target_name": best.get("target_name"), "best_draft": best.get("draft"),
                    "identity": best["identity"]})
    return out


def divergences(requests: Sequence[dict]) -> list[dict]:
    """Greedy runs whose output differs from AR's, with AR's top-1/top-2 margin there,
    labelled as their group rows are."""
    return [{"label": r["label"], "request_id": r["request_id"], "category": r["category"],
             "prompt_index": r["prompt_index"],
             "repeat": r["repeat"], "method": r["method"], "k": r["k"],
             **{key: r.get(key) for key in ("target", "draft", "target_name", "draft_name")}, **r["identity"]}
            for r in labelled(requests) if r.get("identity") and not r["identity"]["identical"]]
