"""Re-running starved requests (starvation.py flags them; docs/bench.md#trust).

A starved request runs again together with its AR partner (the AR request of
the same prompt, repeat, T and max_new_tokens: speedups pair them), in re-run
passes after the sweep, so that a burst of load has time to pass. Each request
is re-run at most `max_reruns` times and the run re-runs at most
`max_total_reruns` generations in all (AR partners included). The last attempt
is kept: requests.jsonl holds it, reruns.jsonl the superseded ones. A method
that learns across requests (`rerunnable`: a shared suffix cache, online
heads) is flagged but not re-run: its cache already holds the prompt's first
output, so a re-run would measure a replay.

A `Unit` is one prompt × repeat × T × max_new_tokens: its `RerunSlot`s are the
AR request and every method request run on it, each holding its attempts
(the last one counts). `RerunQueue` keeps units in run order: a unit with
nothing to re-run is finalized (written, identity checked) as soon as every
unit before it is; the others wait for the re-run passes after the sweep.

A pass re-runs, per unit that still has a starved, re-runnable slot with
re-runs left, its AR slot first and then those starved slots (so a re-run
method is timed right after a fresh AR partner); an AR slot starved on its
own is re-run alone. A pass that would exceed the run's re-run cap skips the
unit. At most `max_reruns` passes run, so no slot runs more than
1 + max_reruns times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...speculative.methods import METHODS as TABLE
from .policy import TrustLog, TrustPolicy

def rerunnable(arm) -> bool:
    """False when the arm's drafting keeps state between requests (a re-run would replay)."""
    return not TABLE[arm.method.method].outlives_request(arm.method.spec(arm.k))


@dataclass(eq=False)
class RerunSlot:
    """One request of a unit and its attempts [(record, result), ...], the last current."""

    arm_index: int
    baseline: bool
    rerunnable: bool  # False: the method learns across requests; a re-run would replay
    attempts: list[tuple[dict, Any]] = field(default_factory=list)
    head: dict = field(default_factory=dict)  # the record fields that name the request (kept by re-runs)

    @property
    def record(self) -> dict:
        return self.attempts[-1][0]

    @property
    def result(self) -> Any:
        return self.attempts[-1][1]

    @property
    def starved(self) -> bool:
        return bool(self.record.get("starved"))

    @property
    def reruns(self) -> int:
        return len(self.attempts) - 1


@dataclass(eq=False)
class Unit:
    """The requests of one prompt × repeat × T × max_new_tokens (AR first)."""

    slots: list[RerunSlot]
    context: Any = None  # what run/sequential.py needs to re-run them (prompt ids, params, ...)

    def wants(self, max_reruns: int) -> list[RerunSlot]:
        """The slots to re-run in the next pass (AR partner first), or []."""
        starved = [s for s in self.slots if s.starved and s.rerunnable and s.reruns < max_reruns]
        if not starved:
            return []
        ar = [s for s in self.slots if s.baseline and s not in starved and s.reruns < max_reruns]
        return sorted(ar + starved, key=lambda s: not s.baseline)


Rerun = Callable[[Unit, RerunSlot, str], tuple[dict, Any]]


class RerunQueue:
    """Units in run order; `rerun(unit, slot, reason)` times a slot again and returns its
    new (record, result); `finalize(unit)` writes a unit once it is settled."""

    def __init__(self, policy: TrustPolicy, cap: int, log: TrustLog, rerun: Rerun,
                 finalize: Callable[[Unit], None], superseded: Callable[[dict], None] | None = None):
        self.policy, self.cap, self.log = policy, cap, log
        self.rerun, self.finalize, self.superseded = rerun, finalize, superseded
        self.used = 0
        self.pending: deque[Unit] = deque()
        log.rerun_cap += cap

    def add(self, unit: Unit) -> None:
        self.pending.append(unit)
        self._flush()

    def _flush(self, final: bool = False) -> None:
        while self.pending and (final or not self.pending[0].wants(self.policy.max_reruns)):
            unit = self.pending.popleft()
            for s in unit.slots:
                if s.starved:
                    self.log.unresolved.append({"request_id": s.record["request_id"], "why": self._why(s)})
            self.finalize(unit)

    def _why(self, s: RerunSlot) -> str:
        """Why a slot is left starved."""
        if not s.rerunnable:
            return ("not re-run: the method learns across requests (its cache holds this prompt's first "
                    "output, so a re-run would replay it)")
        if not self.policy.max_reruns:
            return "not re-run: --max-reruns is 0"
        if s.reruns >= self.policy.max_reruns:
            return f"starved on all {s.reruns} re-runs"
        return f"not re-run further: the run's re-run cap ({self.cap}) was reached"

    def finish(self) -> None:
        """Run the re-run passes, then finalize every unit left (noting why a slot stays starved)."""
        for n in range(1, self.policy.max_reruns + 1):
            todo = [(u, batch) for u in self.pending if (batch := u.wants(self.policy.max_reruns))]
            if not todo:
                break
            for unit, batch in todo:
                if self.used + len(batch) > self.cap:
                    continue
                self.used += len(batch)
                starved_ids = [s.record["request_id"] for s in batch if s.starved]
                for slot in batch:
                    self._run(unit, slot, n, starved_ids)
        self._flush(final=True)

    def _run(self, unit: Unit, slot: RerunSlot, n: int, starved_ids: list[str]) -> None:
        before = slot.record
        reason = "starved" if slot.starved else "AR partner"
        detail = before["starved"] if slot.starved else f"AR partner of {', '.join(starved_ids)}"
        event = {k: before.get(k) for k in ("request_id", "category", "prompt_index", "repeat", "temperature",
                                            "max_new_tokens", "method", "k", "target_name", "draft_name")
                 if k in before}
        event.update({"pass": n, "reason": reason, "detail": detail,
                      "before": {"wall_ms": before["wall_ms"], "cpu_share": before.get("cpu_share")}})
        record, result = self.rerun(unit, slot, f"starved: {detail}" if slot.starved else detail)
        record["attempt"] = slot.reruns + 1
        record["earlier_attempts"] = [*before.get("earlier_attempts", []), {
            "wall_ms": before["wall_ms"], "cpu_share": before.get("cpu_share"), "starved": before.get("starved"),
            "rerun_reason": before.get("rerun_reason")}]
        slot.attempts.append((record, result))
        event["after"] = {"wall_ms": record["wall_ms"], "cpu_share": record.get("cpu_share"),
                          "starved": bool(record.get("starved"))}
        self.log.reruns.append(event)
        if self.superseded:
            self.superseded(before)
