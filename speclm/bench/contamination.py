"""Contamination: requests starved of CPU by another process, flagged and re-run.

The rule (`starved`): over one request, its CPU share = process CPU seconds
(time.process_time: every thread of this process) / wall seconds. While
llama.cpp computes it keeps its threads busy, so on a quiet machine the share
is close to min(threads, cores); another process holding a core drags it down
(llama.cpp's threads wait for each other: design note §6). A share below
`min_share` × min(threads, cores) (default 0.6) flags the request as starved.
Requests whose thread count is unknown (toy backends) are never flagged.

Re-runs (reruns.py): a starved request runs again together with its AR
partner (the AR request of the same prompt, repeat, T and max_new_tokens:
speedups pair them), in re-run passes after the sweep, so that a burst of
load has time to pass. Each request is re-run at most `max_reruns` times and
the run re-runs at most `max_total_reruns` generations in all (AR partners
included). The last attempt is kept: requests.jsonl holds it, reruns.jsonl
the superseded ones. A method that learns across requests (a shared suffix
cache) is flagged but not re-run: its cache already holds the prompt's first
output, so a re-run would measure a replay.

Quiet: before the timed requests, `wait_for_quiet` polls the 1-minute load
average until it is below `quiet_load` (default half the cores), for at most
`wait_quiet_s` seconds (the CLI waits 60 s by default; the API does not wait).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidRequestError
from .tables import md_table

CROSS_REQUEST_PROPOSALS = frozenset({"suffix"})  # proposals whose state outlives a request
cpu_clock: Callable[[], float] = time.process_time  # CPU seconds of this process (a test may replace it)


@dataclass
class TrustPolicy:
    """Thresholds of the contamination check (all recorded in the manifest)."""

    min_share: float = 0.6  # flag below min_share × min(threads, cores); 0 disables the check
    max_reruns: int = 3  # re-runs per request
    max_total_reruns: int | None = None  # re-run generations in all; None: half the planned requests (>= 4)
    wait_quiet_s: float = 0.0  # wait up to this long for a quiet machine before timing
    quiet_load: float | None = None  # quiet: 1-minute load average below this; None: half the cores
    poll_s: float = 5.0
    notify: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.min_share <= 1:
            raise InvalidRequestError(f"--min-cpu-share must be in [0, 1], got {self.min_share}")
        if self.max_reruns < 0 or (self.max_total_reruns is not None and self.max_total_reruns < 0):
            raise InvalidRequestError("--max-reruns and --max-total-reruns must be >= 0")
        if self.wait_quiet_s < 0 or (self.quiet_load is not None and self.quiet_load <= 0) or self.poll_s <= 0:
            raise InvalidRequestError("--wait-quiet must be >= 0 and --quiet-load > 0")

    def total_cap(self, planned: int) -> int:
        return self.max_total_reruns if self.max_total_reruns is not None else max(4, planned // 2)

    def quiet_threshold(self, cores: int) -> float:
        return self.quiet_load if self.quiet_load is not None else cores * 0.5

    def to_dict(self) -> dict:
        return {"min_cpu_share": self.min_share, "max_reruns": self.max_reruns,
                "max_total_reruns": self.max_total_reruns, "wait_quiet_s": self.wait_quiet_s,
                "quiet_load": self.quiet_load, "poll_s": self.poll_s}


@dataclass
class TrustLog:
    """What the check saw: quiet waits, re-runs, requests left starved (and why)."""

    waits: list[dict] = field(default_factory=list)
    reruns: list[dict] = field(default_factory=list)
    unresolved: list[dict] = field(default_factory=list)
    rerun_cap: int = 0  # summed over the run_bench calls that share this log

    def to_dict(self) -> dict:
        return {"waits": self.waits, "reruns": self.reruns, "unresolved": self.unresolved,
                "rerun_cap": self.rerun_cap}


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


def wait_for_quiet(policy: TrustPolicy, cores: int, loadavg: Callable[[], tuple] = os.getloadavg,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll the 1-minute load average until it is below the quiet threshold, for at most
    policy.wait_quiet_s seconds (0: one reading). Returns what it saw."""
    threshold, t0 = policy.quiet_threshold(cores), clock()
    loads: list[list[float]] = []
    quiet = False
    while True:
        load1 = float(loadavg()[0])
        loads.append([round(clock() - t0, 1), load1])
        if load1 < threshold:
            quiet = True
            break
        left = policy.wait_quiet_s - (clock() - t0)
        if left <= 0:
            break
        if len(loads) == 1 and policy.notify:
            policy.notify(f"waiting up to {policy.wait_quiet_s:g} s for a quiet machine: load average "
                          f"{load1:.2f} >= {threshold:.2f} (--no-wait-quiet skips this)")
        sleep(min(policy.poll_s, left))
    return {"threshold": threshold, "max_wait_s": policy.wait_quiet_s, "waited_s": round(clock() - t0, 1),
            "quiet": quiet, "loads": loads}


# ---- the summary section ---------------------------------------------------------
def summarize(requests: Sequence[dict], contamination: dict | None) -> dict | None:
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


def headline(c: dict) -> str:
    """One sentence: flagged, re-run (why), recovered, still starved."""
    p = c["policy"]
    by = ", ".join(f"{n} {why}" for why, n in c["reruns_by_reason"].items()) or "none"
    text = (f"{c['flagged']} of {c['checked']} checked requests starved of CPU (share < {p['min_cpu_share']:g} × "
            f"threads); {c['reruns']} re-run generations ({by}; cap {c['rerun_cap']}), "
            f"{c['recovered']} recovered, {len(c['still_starved'])} still starved")
    waits = [w for w in c["waits"] if w["max_wait_s"] > 0]
    if waits:
        w = waits[-1]
        text += (f"; waited {w['waited_s']:g} s for quiet (load {w['loads'][-1][1]:.2f}, threshold "
                 f"{w['threshold']:.2f}: {'quiet' if w['quiet'] else 'never quiet'})")
    return text + "."


def render(c: dict | None, reruns: Sequence[dict] = ()) -> list[str]:
    """The "Contamination" section of report.md."""
    if not c:
        return []
    p = c["policy"]
    parts = ["", "## Contamination (CPU starvation) and re-runs", "",
             f"A request is starved when its process CPU share (CPU s / wall s) is below "
             f"{p['min_cpu_share']:g} × the threads llama.cpp computes with; it is re-run with its AR partner "
             f"after the sweep, at most {p['max_reruns']} times each and {c['rerun_cap']} generations in all; "
             "the last attempt is the one reported (reruns.jsonl keeps the others).", "", f"**{headline(c)}**"]
    if reruns:
        body = [(e["request_id"], e["category"], str(e["prompt_index"]),
                 e["method"] + (f" K={e['k']}" if e["k"] else ""), str(e["pass"]), e["reason"],
                 _share(e["before"]), _share(e.get("after")),
                 f"{e['before']['wall_ms']:.0f} → {e['after']['wall_ms']:.0f}" if e.get("after") else "-")
                for e in reruns]
        parts += ["", md_table(("request", "category", "prompt", "method", "pass", "why", "CPU share before",
                                "after", "wall ms"), body)]
    if c["still_starved"]:
        parts += ["", "Still starved (their ratios are unreliable):", ""]
        parts += [f"- {s['request_id']} {s['category']} #{s['prompt_index']} {s['method']}: CPU share "
                  f"{_share(s)}; {s['why_not_rerun'] or 'starved again on every re-run'}" for s in c["still_starved"]]
    return parts


def _share(d: dict | None) -> str:
    return "-" if not d or d.get("cpu_share") is None else f"{d['cpu_share']:.2f}"
