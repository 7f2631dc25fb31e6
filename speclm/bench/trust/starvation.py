"""Starvation: a request that another process kept from the CPU is flagged (and re-run:
reruns.py), under the thresholds of policy.py (docs/bench.md#trust).

The rule (`starved`): over one request, its CPU share = process CPU seconds
(time.process_time: every thread of this process) / wall seconds. While
llama.cpp computes it keeps its threads busy, so on a quiet machine the share
is close to min(threads, cores); another process holding a core drags it down
(llama.cpp's threads wait for each other: docs/bench.md#trust). A share below
`min_share` × min(threads, cores) (default 0.6) flags the request as starved.
Requests whose thread count is unknown (toy backends) are never flagged.
`starvation_summary` is summary.json's "contamination": what was flagged, re-run and left.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from ...speculative.methods import METHODS as TABLE

cpu_clock: Callable[[], float] = time.process_time  # CPU seconds of this process (a test may replace it)


def expected_share(threads: int | None, cores: int) -> int | None:
    """The CPU share a request computing on `threads` threads gets on a quiet machine."""
    return min(threads, cores) if threads else None


def starved(cpu_s: float, wall_s: float, threads: int | None, min_share: float, cores: int) -> str | None:
    """Why a request counts as starved (its CPU share is below min_share × min(threads,
    cores)), or None: not starved, or no thread count to judge by."""
    expected = expected_share(threads, cores)
    if expected is None or wall_s <= 0 or min_share <= 0:
        return None
    share = cpu_s / wall_s
    if share < min_share * expected:
        return (f"CPU share {share:.2f} < {min_share:g} × {expected} thread{'s' if expected > 1 else ''}: "
                f"starved by another process")
    return None


def judged_threads(arm) -> int | None:
    """The threads an arm's requests compute with on the target, which their CPU share is
    judged by (None: not a threaded backend, never judged)."""
    base = getattr(arm.llm.target, "n_threads", None)
    if base is None:
        return None
    try:
        return TABLE[arm.method.method].threads(arm.llm, arm.method.spec(arm.k)) or base
    except Exception:  # a method whose thread policy needs what this LLM lacks: its default
        return base


def starved_warnings(requests: Sequence[dict], rows: Sequence[dict]) -> list[str]:
    """The run's warnings about starved requests left after the re-runs and starved
    concurrency rows (never re-run)."""
    out = []
    left = sum(1 for r in requests if r.get("starved"))
    if left:
        out.append(f"{left} request{'s' if left > 1 else ''} still starved of CPU after re-runs "
                   "(see report.md, Contamination): their ratios are unreliable; rerun on a quiet machine")
    if any(c["starved"] for c in rows):
        out.append(f"{sum(1 for c in rows if c['starved'])} concurrency rows starved of CPU (not re-run): "
                   "their throughput is unreliable")
    return out


def starvation_summary(requests: Sequence[dict], contamination: dict | None) -> dict | None:
    """summary["contamination"]: the policy, the quiet waits, how many requests were
    checked, flagged, re-run (by reason) and are still starved. None without a policy."""
    if not contamination:
        return None
    observed = contamination.get("observed") or {}
    policy = {k: v for k, v in contamination.items() if k != "observed"}
    reruns = observed.get("reruns", [])
    flagged = [r for r in requests if r.get("starved") or any(a.get("starved") for a in r.get("earlier_attempts", []))]
    still = [r for r in requests if r.get("starved")]
    why_left = {u["request_id"]: u["why"] for u in observed.get("unresolved", [])}
    return {"policy": policy, "waits": observed.get("waits", []),
            "checked": sum(1 for r in requests if r.get("threads")),
            "flagged": len(flagged), "flagged_ids": [r["request_id"] for r in flagged],
            "reruns": len(reruns), "rerun_requests": len({e["request_id"] for e in reruns}),
            "reruns_by_reason": dict(Counter(e["reason"] for e in reruns)),
            "rerun_cap": observed.get("rerun_cap"),
            "recovered": sum(1 for r in flagged if not r.get("starved")),
            "still_starved": [{"request_id": r["request_id"], "category": r["category"],
                               "prompt_index": r["prompt_index"], "method": r["method"], "k": r["k"],
                               "cpu_share": r.get("cpu_share"), "why_not_rerun": why_left.get(r["request_id"])}
                              for r in still]}
