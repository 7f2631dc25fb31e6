"""A quiet machine: other processes' CPU use before the timed requests, the load
average while and after them (docs/bench.md#trust).

Before the timed requests `wait_for_quiet` samples how many CPUs other processes
keep busy (`speclm.machine.busy_cpus`, a 1 s sample: not the load average, which
would still count a compile or this bench's own model loading for a minute after
they end) until it is below the policy's `quiet_load` (default half the cores), for
at most `wait_quiet_s` seconds (the CLI waits 60 s by default; the API takes one
sample). The run's warnings say when the machine was busy at the start
(`speclm.machine.busy_warning`), never got quiet (`after_wait`), or got busy while
it ran (`busy_during`: the load average over the run against this bench's threads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ... import machine
from .policy import TrustPolicy


def wait_for_quiet(policy: TrustPolicy, cores: int, busy: Callable[[], float] | None = None,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict:
    """Sample the CPUs other processes keep busy (busy(); default `machine.busy_cpus`)
    until they are below the quiet threshold, for at most policy.wait_quiet_s seconds
    (0: one sample). Returns what it saw ("loads": [seconds since the start, busy CPUs])."""
    threshold, t0 = policy.quiet_threshold(cores), clock()
    loads: list[list[float]] = []
    quiet, read = False, busy or machine.busy_cpus
    while True:
        load1 = float(read())
        loads.append([round(clock() - t0, 1), load1])
        if load1 < threshold:
            quiet = True
            break
        left = policy.wait_quiet_s - (clock() - t0)
        if left <= 0:
            break
        if len(loads) == 1 and policy.notify:
            policy.notify(f"waiting up to {policy.wait_quiet_s:g} s for a quiet machine: other processes keep "
                          f"{load1:.2f} CPUs busy >= {threshold:.2f} (--no-wait-quiet skips this)")
        sleep(min(policy.poll_s, left))
    return {"threshold": threshold, "max_wait_s": policy.wait_quiet_s, "waited_s": round(clock() - t0, 1),
            "quiet": quiet, "loads": loads}


def after_wait(warnings: list[str], wait: dict) -> list[str]:
    """The start's warnings once the wait is over: a machine busy at the start that got
    quiet before the timing is no longer busy; one that never got quiet is said to be so."""
    if wait["max_wait_s"] > 0 and wait["quiet"]:
        return [w for w in warnings if not w.startswith("MACHINE BUSY")]
    if wait["max_wait_s"] > 0:
        return [*warnings, f"MACHINE NEVER QUIET: other processes keep {wait['loads'][-1][1]:.2f} CPUs busy >= "
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
    return [f"this machine never got quiet ({wait['loads'][-1][1]:.2f} CPUs busy >= {wait['threshold']:.2f}): if a "
            "server runs here, its timings are noisy"]
