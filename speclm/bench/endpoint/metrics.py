"""Speculation figures scraped from a server's Prometheus /metrics, before and after
an endpoint bench: the counters' differences cover our requests (and any other
traffic the server had meanwhile).

Names read (samples, as exposed):
- speclm (speclm/server/prom.py): speclm_spec_drafted_tokens_total,
  speclm_spec_accepted_tokens_total, speclm_spec_rounds_total (label method),
  speclm_spec_position_proposed_total / speclm_spec_position_accepted_total
  (labels method, position = 1..K), speclm_completion_tokens_total;
- vLLM (v1 engine): vllm:spec_decode_num_drafts_total,
  vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total,
  vllm:spec_decode_num_accepted_tokens_per_pos_total (label position = 0..K-1);
  the older engine's vllm:spec_decode_num_emitted_tokens_total and gauges
  vllm:spec_decode_draft_acceptance_rate, vllm:spec_decode_efficiency are kept
  as read when present.
Derived (docs/design.md#metrics): acceptance rate = accepted / drafted; mean acceptance
length = tokens per target forward = (accepted + rounds) / rounds for speclm,
1 + accepted / drafts for vLLM; per-position acceptance = accepted at j / drafts
reaching j (speclm) or / drafts (vLLM).
"""

from __future__ import annotations

from collections import defaultdict

SPECLM = {"drafted": "speclm_spec_drafted_tokens_total", "accepted": "speclm_spec_accepted_tokens_total",
          "rounds": "speclm_spec_rounds_total", "completion_tokens": "speclm_completion_tokens_total"}
SPECLM_POS = ("speclm_spec_position_proposed_total", "speclm_spec_position_accepted_total")
VLLM = {"drafts": "vllm:spec_decode_num_drafts_total", "drafted": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "emitted": "vllm:spec_decode_num_emitted_tokens_total"}
VLLM_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_GAUGES = ("vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency")
WANTED = (*SPECLM.values(), *SPECLM_POS, *VLLM.values(), VLLM_POS, *VLLM_GAUGES)


def parse(text: str) -> dict[str, list[tuple[dict, float]]]:
    """The samples we read, by sample name: [(labels, value), ...]. ValueError if not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in WANTED:
                out[s.name].append((dict(s.labels), float(s.value)))
    return dict(out)


def scrape(url: str, api_key: str | None, timeout: float) -> dict:
    """{"ok": True, "samples": ...} or {"ok": False, "why": ...}: /metrics is optional, never an error."""
    import httpx
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url + "/metrics", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return {"ok": False, "why": f"GET /metrics failed: {type(exc).__name__}"}
    if resp.status_code in (401, 403):
        return {"ok": False, "why": f"GET /metrics answered HTTP {resp.status_code}: pass the server's operator key "
                                    "(--endpoint-operator-key or $SPECLM_OPERATOR_KEY)"}
    if resp.status_code != 200:
        return {"ok": False, "why": f"GET /metrics answered HTTP {resp.status_code}"}
    try:
        return {"ok": True, "samples": parse(resp.text)}
    except ValueError:
        return {"ok": False, "why": "GET /metrics is not Prometheus text"}


def _sum(samples: dict, name: str, **match) -> float | None:
    rows = [v for labels, v in samples.get(name, []) if all(labels.get(k) == x for k, x in match.items())]
    return sum(rows) if rows else None


def _diff(before: dict, after: dict, name: str, **match) -> float | None:
    a = _sum(after, name, **match)
    return None if a is None else a - (_sum(before, name, **match) or 0.0)


def _positions(samples: dict, name: str) -> list[str]:
    return sorted({labels.get("position") for labels, _ in samples.get(name, []) if labels.get("position")}, key=int)


def speculation(before: dict, after: dict) -> dict:
    """The derived figures from two scrapes ({"ok": ...} dicts); "source" says whose names matched."""
    if not (before.get("ok") and after.get("ok")):
        return {"source": None, "why": after.get("why") or before.get("why")}
    b, a = before["samples"], after["samples"]
    if any(n in a for n in SPECLM.values()):
        d = {k: _diff(b, a, n) for k, n in SPECLM.items()}
        pos = _positions(a, SPECLM_POS[0])
        prop = [_diff(b, a, SPECLM_POS[0], position=p) or 0.0 for p in pos]
        acc = [_diff(b, a, SPECLM_POS[1], position=p) or 0.0 for p in pos]
        by_method = {}
        for m in sorted({labels.get("method") for labels, _ in a.get(SPECLM["drafted"], [])} - {None}):
            dr, ac, ro = (_diff(b, a, SPECLM[k], method=m) or 0.0 for k in ("drafted", "accepted", "rounds"))
            if ro or dr:
                by_method[m] = {"drafted": dr, "accepted": ac, "rounds": ro}
        return {"source": "speclm", **d, "by_method": by_method,
                "acceptance_rate": d["accepted"] / d["drafted"] if d["drafted"] else None,
                "mean_acceptance_length": (d["accepted"] + d["rounds"]) / d["rounds"] if d["rounds"] else None,
                "per_position_acceptance": [x / y for x, y in zip(acc, prop) if y]}
    if any(n in a for n in (*VLLM.values(), VLLM_POS, *VLLM_GAUGES)):
        d = {k: _diff(b, a, n) for k, n in VLLM.items()}
        drafts = d["drafts"]
        per_pos = [_diff(b, a, VLLM_POS, position=p) or 0.0 for p in _positions(a, VLLM_POS)]
        return {"source": "vllm", **d, "gauges": {g: _sum(a, g) for g in VLLM_GAUGES if g in a},
                "acceptance_rate": d["accepted"] / d["drafted"] if d["drafted"] and d["accepted"] is not None else None,
                "mean_acceptance_length": 1 + d["accepted"] / drafts if drafts and d["accepted"] is not None else None,
                "per_position_acceptance": [x / drafts for x in per_pos] if drafts else []}
    return {"source": None, "why": "no speculative-decoding metrics (speclm_spec_* or vllm:spec_decode_*) exposed"}
