"""Counts over a request's round trace, the sufficient statistics every acceptance
figure is computed from (docs/design.md#metrics):

- acceptance rate            Σ a_r / Σ K_r
- mean acceptance length     Σ (a_r + 1) / rounds
- per-position acceptance j  #(a_r ≥ j) / #(K_r ≥ j)

plus what SSD's speculation cache and Medusa's heads add to a round (`ssd_counts`,
`heads_counts`). A trace is RoundRecords or their dict form.
"""

from __future__ import annotations

from collections.abc import Iterable


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


def acceptance_from_counts(c: dict) -> dict:
    """acceptance_rate, mean_acceptance_length, per_position_acceptance (None when undefined)."""
    return {"acceptance_rate": c["accepted"] / c["proposed"] if c["proposed"] else None,
            "mean_acceptance_length": c["emitted"] / c["rounds"] if c["rounds"] else None,
            "per_position_acceptance": [a / e for a, e in zip(c["pos_accepted"], c["pos_eligible"]) if e]}


def ssd_counts(rounds) -> dict:
    """SSD rounds only: cache hits overall and by the outcome k they answered, and the
    verifier's wait for blocks ({} when no round went through a speculator)."""
    ssd = [r.info for r in rounds if r.info and "hit" in r.info]
    if not ssd:
        return {}
    by_k: dict[str, list[int]] = {}
    for info in ssd:
        if "outcome_k" in info:
            h_n = by_k.setdefault(str(info["outcome_k"]), [0, 0])
            h_n[0] += bool(info["hit"])
            h_n[1] += 1
    return {"cache_rounds": len(ssd), "cache_hits": sum(bool(i["hit"]) for i in ssd), "cache_hits_by_k": by_k,
            "speculator_wait_ms": sum(i.get("wait_ms", 0.0) for i in ssd),
            "speculator_wait_hit_ms": sum(i.get("wait_ms", 0.0) for i in ssd if i["hit"]),
            "speculator_busy_ms": sum(i.get("busy_ms", 0.0) for i in ssd)}


def heads_counts(rounds) -> dict:
    """Per request: rounds drafted by heads, their ms, online-learning ms and each
    round's (proposed, accepted) for the learning curve ({} for other proposers)."""
    heads = [r for r in rounds if r.info and "heads_ms" in r.info]
    if not heads:
        return {}
    return {"heads_rounds": len(heads), "heads_ms": sum(r.info["heads_ms"] for r in heads),
            "learn_ms": sum(r.info.get("learn_ms", 0.0) for r in heads),
            "round_pa": [[r.proposed, r.accepted] for r in rounds]}


def forced_counts(result) -> dict:
    """A constrained request ({} otherwise): its emitted tokens the grammar forced, and its
    drafts' forced tokens proposed and accepted (the rest's acceptance is
    (accepted − forced_accepted) / (proposed − forced_proposed))."""
    if result.forced_tokens is None:
        return {}
    infos = [r.info or {} for r in result.rounds]
    return {"forced_tokens": result.forced_tokens, "forced_proposed": sum(i.get("forced", 0) for i in infos),
            "forced_accepted": sum(i.get("forced_accepted", 0) for i in infos)}
