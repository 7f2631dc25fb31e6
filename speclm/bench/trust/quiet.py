"""A quiet machine: the load average before, while and after the timed requests
(docs/bench.md#trust).

Before the timed requests `wait_for_quiet` polls the 1-minute load average until
it is below the policy's `quiet_load` (default half the cores), for at most
`wait_quiet_s` seconds (the CLI waits 60 s by default; the API does not wait).
The run's warnings say when the machine was busy at the start (`speclm.machine.busy_warning`),
never got quiet (`after_wait`), or got busy while it ran (`busy_during`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from .policy import TrustPolicy


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


def after_wait(warnings: list[str], wait: dict) -> list[str]:
    """The start's warnings once the wait is over: a machine busy at the start (often this
    bench's own model loading) that got quiet before the timing is no longer busy; one
    that never got quiet is said to be so."""
    if wait["max_wait_s"] > 0 and wait["quiet"]:
        return [w for w in warnings if not w.startswith("MACHINE BUSY")]
    if wait["max_wait_s"] > 0:
        return [*warnings, f"MACHINE NEVER QUIET: load average {wait['loads'][-1][1]:.2f} >= "
                           f"{wait['threshold']:.2f} after waiting {wait['waited_s']:g} s (--wait-quiet); "
                           "timings may be noisy"]
    return warnings


def busy_during(warnings: Sequence[str], loads: Sequence[float], own_threads: int, cores: int) -> list[str]:
    """A warning when the load average reached more than this bench's own threads explain
    (the machine was quiet at the start), else none."""
    peak = max(loads)
    if not any("BUSY" in w for w in warnings) and peak > own_threads + cores * 0.5:
        return [f"MACHINE BUSY DURING THE RUN: load average reached {peak:.2f} on {cores} cores, more "
                f"than this bench's own {own_threads} threads explain (quiet at start); per-request load is in "
                f"requests.jsonl (load1): rerun on a quiet machine"]
    return []


def client_never_quiet(wait: dict) -> list[str]:
    """An endpoint bench's warning when this machine (the client, maybe the server too)
    never got quiet in the wait, else none."""
    if wait["quiet"] or not wait["max_wait_s"]:
        return []
    return [f"this machine never got quiet (load {wait['loads'][-1][1]:.2f} >= {wait['threshold']:.2f}): if a "
            "server runs here, its timings are noisy"]
