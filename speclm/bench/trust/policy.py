"""The trust policy (its thresholds, recorded in the manifest) and the log of what it saw."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import InvalidRequestError
from ...options import option


@dataclass
class TrustPolicy:
    """Thresholds of the contamination check (all recorded in the manifest); each a
    declared setting (`speclm bench`'s flags are generated from them)."""

    min_share: float = option(0.6, "flag a request whose process CPU share (CPU s / wall s) is below F x the "
                              "threads llama.cpp computes with (0 turns the check off)", flag="--min-cpu-share",
                              metavar="F")
    max_reruns: int = option(3, "re-run a flagged request (with its AR partner) at most N times (0: flag only)",
                             metavar="N")
    max_total_reruns: int | None = option(None, "re-run at most N generations in all (default: half the planned "
                                          "requests, at least 4)", kind=int, metavar="N")
    wait_quiet_s: float = option(0.0, "before timing, wait up to SECONDS for other processes to keep fewer CPUs "
                                 "busy than --quiet-load, sampled 1 s at a time (the command waits by default, "
                                 "the library does not)",
                                 flag="--wait-quiet", cli_default=60.0, metavar="SECONDS")
    quiet_load: float | None = option(None, "the CPUs other processes may keep busy on a quiet machine "
                                      "(default: half the cores)", kind=float, metavar="LOAD")
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
