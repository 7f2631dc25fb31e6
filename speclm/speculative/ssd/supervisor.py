"""Keeps an LLM's SSD speculator in service: a lost one (its process died, it
stopped answering, its transport failed) is replaced on the next SSD request.

Restarts are bounded: the first comes at once; while speculators keep dying
within `stable_s` of their start (or fail to start), each further try waits
`restart_backoff_s`, doubling; after `max_restarts` failures in a row the
supervisor gives up and SSD requests stay on the synchronous draft path
(same output). `state()` is what /health and /metrics show.
"""

from __future__ import annotations

import logging
import threading
import time

from .client import SpeculatorConfig, SpeculatorLost, SpeculatorProcess

log = logging.getLogger("speclm.ssd")


class SpeculatorSupervisor:
    """The current SpeculatorProcess of one LLM, restarted when lost.

    Construction starts the first one: its errors raise (the first request
    learns that SSD cannot run), unless the speculator is one found by
    cfg.locate (a Ray actor): then requests go on synchronously until it is found. Restart errors never raise: they are logged
    and counted, and requests go on synchronously meanwhile.
    """

    def __init__(self, model: str, cfg: SpeculatorConfig, spawn=SpeculatorProcess):
        self.model, self.cfg, self._spawn = model, cfg, spawn
        self._lock = threading.Lock()
        self.restarts = 0  # speculators started after the first
        self.failures = 0  # losses and failed starts in a row (reset by a speculator that lived stable_s)
        self._retry_at = 0.0
        self._seen_loss: SpeculatorProcess | None = None
        self._gave_up = False
        try:
            self.process = spawn(model, cfg)
        except Exception as exc:
            if cfg.locate is None:
                raise
            self.process = _Unreachable(str(exc))  # one we do not own: go on synchronously, retry later
            self._fail(f"not reachable: {exc}")

    def get(self) -> SpeculatorProcess:
        """The speculator for a new SSD request: the current one while it is usable, else
        a restarted one when a restart is due; else the lost one (whose open() refuses)."""
        with self._lock:
            proc = self.process
            if proc.check():
                return proc
            self._count_loss(proc)
            if self.failures > self.cfg.max_restarts or time.monotonic() < self._retry_at:
                return proc
            proc.retire()
            try:
                self.process = self._spawn(self.model, self.cfg)
            except Exception as exc:  # noqa: BLE001 - any start failure is one more failure
                self._fail(f"restart failed: {exc}")
                return proc
            self.restarts += 1
            log.warning("SSD speculator restarted (pid %s, restart %d)", self.process.pid, self.restarts)
            return self.process

    def _count_loss(self, proc: SpeculatorProcess) -> None:
        if self._seen_loss is proc:
            return
        self._seen_loss = proc
        lived = (proc.lost_at or time.monotonic()) - proc.started_at
        self.failures = 1 if lived >= self.cfg.stable_s else self.failures + 1
        self._schedule()

    def _fail(self, why: str) -> None:
        self.failures += 1
        self._schedule()
        log.warning("SSD speculator %s: requests continue on the synchronous draft path", why)

    def _schedule(self) -> None:
        if self.failures > self.cfg.max_restarts:
            if not self._gave_up:
                self._gave_up = True
                log.warning("SSD speculator: giving up after %d failures in a row: SSD requests stay on the "
                            "synchronous draft path (restart the server to try again)", self.failures)
            return
        delay = 0.0 if self.failures <= 1 else min(self.cfg.max_backoff_s,
                                                   self.cfg.restart_backoff_s * 2 ** min(self.failures - 2, 30))
        self._retry_at = time.monotonic() + delay

    def state(self) -> dict:
        """{"state": "alive" | "lost", "restarts", "pid", "reason"} (reason: why it was lost)."""
        proc = self.process
        alive = proc.check()
        return {"state": "alive" if alive else "lost", "restarts": self.restarts, "pid": proc.pid,
                "reason": None if alive else proc.lost}

    def close(self) -> None:
        with self._lock:
            self.process.close()


class _Unreachable:
    """Stands for a speculator that could not be reached at the first start (a lost one)."""

    pid = None

    def __init__(self, why: str):
        self.lost, self.started_at = why, time.monotonic()
        self.lost_at = self.started_at

    def check(self) -> bool:
        return False

    def open(self):
        raise SpeculatorLost(self.lost)

    def retire(self) -> None:
        pass

    def close(self) -> None:
        pass
