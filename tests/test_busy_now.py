""""Busy" is what the CPUs do now: other processes' share of a short /proc/stat sample,
not the load average, which still counts a compile (a `pip install`, a model's assembly)
for a minute after it ended, so the kernel probe and the bench cried wolf right after
one (speclm/machine.py: busy_cpus, busy_warning)."""

from __future__ import annotations

import os
import time

import pytest

from speclm import machine


class Script:
    """/proc/stat's (busy, all) ticks and this process's CPU seconds, before and after a sample."""

    def __init__(self, ticks, own=(0.0, 0.0)):
        self.ticks, self.own, self.slept = list(ticks), list(own), []

    def read_ticks(self):
        return self.ticks.pop(0)

    def own_cpu(self):
        return self.own.pop(0)


def sample(script: Script, seconds: float = 1.0) -> float:
    return machine.busy_cpus(seconds, ticks=script.read_ticks, own_cpu=script.own_cpu, clock=lambda: 0.0,
                             sleep=script.slept.append)


def test_idle_cpus_read_as_quiet_whatever_the_load_average_remembers(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.92, 1.5, 0.8))  # a compile that ended seconds ago
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    busy = sample(Script([(5000, 90000), (5004, 90200)]))
    assert busy == pytest.approx(0.04) and machine.busy_warning(busy, 2) is None


def test_cpus_busy_now_read_as_busy_with_the_usual_warning(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    script = Script([(5000, 90000), (5190, 90200)])
    busy = sample(script, seconds=1.0)
    assert busy == pytest.approx(1.9) and script.slept == [1.0]
    warning = machine.busy_warning(busy, 2, fix="re-probe")
    assert warning.startswith("MACHINE BUSY: other processes keep 1.90 of 2 cores busy (> 1.0) at start;")
    assert warning.endswith(": re-probe")


def test_this_processs_own_threads_are_not_counted(monkeypatch):
    """The probe's and the bench's own threads (a model just loaded, a warm-up) are not
    'other processes': their CPU time in the sample is taken off."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert sample(Script([(5000, 90000), (5190, 90200)], own=(10.0, 11.0))) == pytest.approx(0.9)


def test_without_proc_stat_the_load_average_is_the_fallback(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 2.0, 1.0))
    script = Script([None])
    assert sample(script) == 3.0 and script.slept == []


def test_a_real_sample_of_this_machine_lasts_as_asked():
    t0 = time.monotonic()
    busy = machine.busy_cpus(0.5)
    assert 0.0 <= busy <= (os.cpu_count() or 1) and 0.5 <= time.monotonic() - t0 < 5.0
