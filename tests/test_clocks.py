"""Forwards, drafts and rounds are timed on one clock, costs.clock_ms: no module
outside costs.py reads a clock of its own, except for the wall-clock uses named
below (timestamps, deadlines, request latencies, logs). A module that runs a
forward and times it cannot be on this list."""

from __future__ import annotations

import ast
from pathlib import Path

import speclm

PACKAGE = Path(speclm.__file__).parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}

WALL_CLOCK = {  # module -> what its own clock reads are for (none times a forward)
    "backends/probe.py": "how long a probe took, in its log line",
    "bench/analysis/model_compare.py": "load times and the elapsed seconds of a comparison, in its log",
    "bench/endpoint/bench.py": "a run's start and end timestamps",
    "bench/endpoint/run.py": "a run's start timestamp",
    "bench/run/concurrent.py": "a concurrency row's wall time and submit times (requests, not forwards)",
    "bench/run/records.py": "a request's wall and CPU seconds (the starvation check)",
    "bench/run/sequential.py": "a run's start and end timestamps",
    "bench/run/sweep.py": "a run's start and end timestamps",
    "bench/trust/quiet.py": "how long the bench waited for a quiet machine (a deadline)",
    "bench/trust/starvation.py": "this process's CPU seconds (the starvation check)",
    "distributed/directory.py": "when a replica last reported (liveness)",
    "distributed/speculator.py": "when a speculator host started",
    "grammar_safety.py": "the compile worker's reply deadline (a grammar compile, not a forward)",
    "heads/online.py": "the online learner's time budget per step (a deadline)",
    "heads/train.py": "training's time budget (deadlines) and its elapsed seconds",
    "loadgen.py": "a client's request latency and time to first token over HTTP",
    "machine.py": "the wall seconds of a /proc/stat sample (how busy other processes keep the CPUs)",
    "models/variants.py": "how long a quantisation took, in the manifest",
    "server/app.py": "the server's start timestamp",
    "server/http.py": "a response's `created` timestamp",
    "server/loadtest.py": "a load test's deadline and wall time",
    "server/prom.py": "an HTTP request's latency (Prometheus histogram)",
    "server/responses.py": "a response's `created` timestamp",
    "speculative/ssd/client.py": "start and reply timeouts of the speculator process (deadlines)",
    "speculative/ssd/supervisor.py": "restart backoff and how long a speculator lived",
    "speculative/ssd/worker.py": "how long the speculator process served, in its log",
}


def clock_reads() -> dict[str, list[int]]:
    """module path (relative to the package) -> lines that read time.<clock>."""
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "time" and node.attr in CLOCKS:
                found.setdefault(path.relative_to(PACKAGE).as_posix(), []).append(node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.module == "time" \
                    and any(a.name in CLOCKS for a in node.names):
                found.setdefault(path.relative_to(PACKAGE).as_posix(), []).append(node.lineno)
    return found


def test_only_costs_and_named_wall_clock_uses_read_a_clock():
    reads = clock_reads()
    unexplained = {m: lines for m, lines in reads.items() if m != "costs.py" and m not in WALL_CLOCK}
    assert not unexplained, (f"these modules read a clock of their own: time forwards, drafts and rounds with "
                             f"costs.clock_ms, or name the wall-clock use in WALL_CLOCK: {unexplained}")


def test_the_wall_clock_list_names_only_modules_that_read_a_clock():
    reads = clock_reads()
    assert "costs.py" in reads
    assert not [m for m in WALL_CLOCK if m not in reads], "a module left the list's reason behind: drop it"


def test_the_engine_times_its_forwards_on_the_cost_clock(monkeypatch):
    """The forward, draft and round times a request records come from costs.clock_ms."""
    from speclm import LLM, SamplingParams, SpecConfig
    from speclm import costs
    from speclm.backends.toy import ToyBackend

    ticks = iter(range(0, 10 ** 6, 7))  # every reading 7 ms after the one before
    monkeypatch.setattr(costs, "clock_ms", lambda: float(next(ticks)))
    for module in ("speclm.speculative.loop", "speclm.speculative.steps"):
        monkeypatch.setattr(f"{module}.clock_ms", costs.clock_ms)
    llm = LLM(target=ToyBackend(vocab_size=12, seed=1))
    result = llm.generate([1, 2, 3], SamplingParams(max_new_tokens=6), SpecConfig(method="ar"))
    assert result.rounds and all(r.verify_ms % 7 == 0 and r.verify_ms > 0 for r in result.rounds)
    assert all(r.other_ms % 7 == 0 for r in result.rounds)
