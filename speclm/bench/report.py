"""Benchmark arithmetic (pure functions over recorded traces) and report.md.

Definitions (design note §2, one each):
- acceptance rate            Σ a_r / Σ K_r
- mean acceptance length     Σ (a_r + 1) / rounds
- per-position acceptance j  #(a_r ≥ j) / #(K_r ≥ j)
- speedup                    AR time per output token / method time per output
                             token over a group's (prompt, repeat) pairs, same
                             run; with prefill and decode apart, and the Σ-wall
                             ratio only over pairs of equal length (ratios.py);
                             the spread is the distribution of per-pair ratios.
Percentiles interpolate linearly between order statistics (numpy's default).
Contamination (starved requests, re-runs): contamination.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from .compare import mib
from .setup.methods import BASELINE
from .ratios import baseline_stats, fmt_x, identity_cell, speedup_stats, wall_cell, worth_it  # noqa: F401
from .distributions import distribution, percentile  # noqa: F401  (public here too)
from .tables import md_table, merge_counts  # noqa: F401  (merge_counts: public here too)

# target / draft: the model files a record ran on (a variant sweep never pools them)
GROUP_KEYS = ("category", "method", "k", "temperature", "max_new_tokens", "target", "draft")
PAIR_KEYS = ("category", "prompt_index", "repeat", "temperature", "max_new_tokens", "target")


# ---- per-request counts ------------------------------------------------------
def _pae(r) -> tuple[int, int, int]:
    """(proposed, accepted, emitted) of a RoundRecord or of its dict form (delivered accounting)."""
    if isinstance(r, dict):
        return r["proposed"], r["accepted"], r.get("emitted", r["accepted"] + 1)
    return r.proposed, r.accepted, r.emitted


def round_counts(rounds: Iterable) -> dict:
    """Sufficient statistics of a trace: totals, and per position j = 1..max K the
    rounds with K_r ≥ j (eligible), with a_r ≥ j (accepted) and rejected exactly at j.
    A round cut short by EOS or a stop delivers fewer tokens: it counts no rejection."""
    rows = [_pae(r) for r in rounds]
    max_k = max((k for k, _, _ in rows), default=0)
    elig, acc, rej = [0] * max_k, [0] * max_k, [0] * max_k
    for k, a, e in rows:
        for j in range(k):
            elig[j] += 1
            acc[j] += a > j
        if a < k and e == a + 1:  # the round's last token (a correction) was delivered: a true rejection
            rej[a] += 1
    return {"rounds": len(rows), "proposed": sum(k for k, _, _ in rows),
            "accepted": sum(a for _, a, _ in rows), "emitted": sum(e for _, _, e in rows),
            "full_accepts": sum(1 for k, a, _ in rows if k > 0 and a == k),
            "pos_eligible": elig, "pos_accepted": acc, "rejection_hist": rej}


def acceptance_from_counts(c: dict) -> dict:
    """acceptance_rate, mean_acceptance_length, per_position_acceptance (None when undefined)."""
    return {"acceptance_rate": c["accepted"] / c["proposed"] if c["proposed"] else None,
            "mean_acceptance_length": c["emitted"] / c["rounds"] if c["rounds"] else None,
            "per_position_acceptance": [a / e for a, e in zip(c["pos_accepted"], c["pos_eligible"]) if e]}


# ---- speedup --------------------------------------------------------------------
def pair_with_ar(requests: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(method record, AR record of the same prompt, repeat, T and max_new_tokens)."""
    ar = {tuple(r.get(k) for k in PAIR_KEYS): r for r in requests if r["method"] == BASELINE}
    return [(r, ar[key]) for r in requests
            if r["method"] != BASELINE and (key := tuple(r.get(k) for k in PAIR_KEYS)) in ar]


# ---- groups ---------------------------------------------------------------------
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


def label(row: dict, models: bool = False) -> str:
    """'sd-draft K=4'; with models, followed by the target (+ draft) it ran on."""
    base = row["method"] if row["method"] == BASELINE or row.get("k") is None else f"{row['method']} K={row['k']}"
    return f"{base} [{model_tag(row)}]" if models else base


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
            if ident else None, "ssd": ssd_stats(recs)}


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


def render_ssd(rows: Sequence[dict]) -> list[str]:
    """The SSD section of report.md (empty when no SSD row ran)."""
    ssd = [r for r in rows if r.get("ssd")]
    if not ssd:
        return []
    models = models_vary(rows)
    body = [(r["category"], label(r, models), f"{r['temperature']:g}", f"{r['ssd']['hit_rate']:.2f}",
             " ".join(f"k={k}:{v:.2f}" for k, v in r["ssd"]["hit_rate_by_k"].items()),
             _f(r["mean_acceptance_length"]), f"{r['ssd']['wait_ms_per_round']:.1f}",
             f"{r['ssd']['busy_ms_per_round']:.1f}") for r in ssd]
    return ["", "## SSD speculation cache", "",
            "hit rate: rounds whose block was pre-drafted while the target verified; by k: the same among "
            "rounds answering an outcome with k accepted tokens; wait: the verifier's wait for a block; "
            "busy: the speculator's pre-drafting time per round.", "",
            md_table(("category", "method", "T", "hit rate", "hit rate by k", "mean acc len", "wait ms/round",
                       "busy ms/round"), body)]


def group_rows(requests: Sequence[dict], overall: bool = True) -> list[dict]:
    """Rows per category (in first-seen order) and, with more than one category, 'all'."""
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
    return rows


def verdicts(rows: Sequence[dict]) -> list[dict]:
    """Per category × target × T × max_new_tokens: enable speculation iff the best config
    (by p50 speedup) has p50 > 1, total speedup > 1 and most prompts faster (ratios.worth_it);
    `identity` carries the best config's greedy identity counts."""
    out = []
    models = models_vary(rows)

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
            evidence = (f"yes: {label(best, models)} {p50:.2f}× (p50; total {tot:.2f}×, "
                        f"range {d['min']:.2f}–{d['max']:.2f}×), {faster}")
        else:
            evidence = f"no: best method {label(best, models)} {p50:.2f}× AR (p50; total {tot:.2f}×), {faster}"
        out.append({"category": cat, "temperature": temp, "max_new_tokens": max_new, "enable": enable,
                    "best": {"method": best["method"], "k": best["k"]}, "evidence": evidence,
                    "target": target, "target_name": best.get("target_name"), "best_draft": best.get("draft"),
                    "identity": best["identity"]})
    return out


def divergences(requests: Sequence[dict]) -> list[dict]:
    """Greedy runs whose output differs from AR's, with AR's top-1/top-2 margin there."""
    return [{"request_id": r["request_id"], "category": r["category"], "prompt_index": r["prompt_index"],
             "repeat": r["repeat"], "method": r["method"], "k": r["k"],
             **{key: r.get(key) for key in ("target", "draft", "target_name", "draft_name")}, **r["identity"]}
            for r in requests if r.get("identity") and not r["identity"]["identical"]]


def _f(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def identity_note(verdict: dict) -> str:
    """'; greedy output identical to AR 3/4' for a verdict with identity counts, else ''."""
    ident = verdict.get("identity")
    return f"; greedy output identical to AR {ident['identical']}/{ident['compared']}" if ident else ""


MAIN_HEADER = ("category", "method", "T", "speedup", "p50 [min–max]", "faster", "decode/tok", "prefill/tok",
               "Σ wall [same len]", "identical", "acc rate", "mean acc len", "tok/s")
RATIOS_NOTE = ("speedup = AR time per output token / method time per output token over the same prompts in "
               "this run (= method tok/s / AR tok/s); p50 [min–max] over per-pair ratios; decode/tok: the same "
               "with prefill taken out; prefill/tok: AR prefill per prompt token / the method's; Σ wall: Σ AR "
               "wall / Σ method wall over the pairs whose output lengths match [matching/all]; identical: "
               "greedy outputs identical to AR [identical/compared].")


def table_rows(summary: dict) -> list[tuple[str, ...]]:
    """The main table: one line per category × method × K × T (× max_new_tokens)."""
    out = []
    models = models_vary(summary["rows"])
    for r in summary["rows"]:
        d = r["speedup_dist"]
        base = r["method"] == BASELINE
        out.append((r["category"] + ("" if len(summary["config"]["max_new_tokens"]) < 2 else f" N={r['max_new_tokens']}"),
                    label(r, models), f"{r['temperature']:g}", "1.00× (base)" if base else fmt_x(r["speedup"]),
                    "-" if base else f"{_f(d['p50'])} [{_f(d['min'])}–{_f(d['max'])}]",
                    "-" if base else f"{r['prompts_faster']}/{r['prompts']}",
                    *(("-",) * 3 if base else (fmt_x(r.get("decode_speedup")), fmt_x(r.get("prefill_speedup")),
                                               wall_cell(r))),
                    identity_cell(r), _f(r["acceptance_rate"], ".3f"), _f(r["mean_acceptance_length"]),
                    _f(r["tokens_per_s"], ".1f")))
    return out


def render_variants(v: dict) -> list[str]:
    """The "Variants" section: one line per target × draft, then the best pair."""
    ks = [str(k) for k in v["ks"]]
    header = ("target (size)", "draft (size)", "target ppl", f"agreement with {v['reference']}", "AR tok/s",
              "v(" + ")/v(".join(ks) + ") ms", "best SD tok/s (config)", "accepted progress /ms", "speedup vs AR")
    rows = [(f"`{r['target']}` ({mib(r['target_size'])})",
             "-" if r["draft"] is None else f"`{r['draft']}` ({mib(r['draft_size'])})",
             _f(r["target_perplexity"], ".3f"), _f(r["agreement"], ".4f"), _f(r["ar_tok_s"], ".1f"),
             " / ".join(_f(r["v_ms"].get(k), ".1f") for k in ks),
             "-" if r["best"] is None else f"{_f(r['sd_tok_s'], '.1f')} ({label(r['best'])})",
             _f(r["accepted_progress_per_ms"], ".4f"), "-" if r["speedup"] is None else f"{r['speedup']:.2f}×")
            for r in v["rows"]]
    files = [f"- `{m['name']}`: {m['file'] or '-'}, sha256 {m['sha256'] or '-'}"
             for m in {m["name"]: m for m in v["targets"] + v["drafts"]}.values()]
    drafts = [f"- draft `{d['name']}`: perplexity {_f(d['perplexity'], '.3f')}, agreement with "
              f"`{v['reference']}` {_f(d['agreement'], '.4f')}, v(1) {_f(d['v_ms'].get('1'), '.1f')} ms"
              for d in v["drafts"]]
    return ["", "## Variants", "",
            f"Each target measured in turn with its own AR requests. v(k): ms to score k tokens after "
            f"{v['v_context_tokens']} context tokens (median of {v['v_repeats']}); accepted progress per ms = "
            f"output tokens / wall ms of the draft config with the most (all prompts pooled); perplexity and "
            f"teacher-forced greedy agreement on the `models compare` text set"
            + ("." if v["quality"] else " (not measured: rerun with --variant-quality)."), "",
            md_table(header, rows), "", f"**{v['best_sentence']}**", "", *drafts, *files]
