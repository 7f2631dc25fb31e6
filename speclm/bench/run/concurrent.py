"""The concurrency rows of the in-process bench: N closed-loop clients through
`speclm.engine.Engine` (each submits its next prompt when its last one finished). The LLM
must hold at least N sequences (LLM(max_sequences=N))."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ...engine import Engine
from ...metrics import GenerationResult
from ..analysis.distributions import distribution
from ..setup.config import Arm, BenchConfig
from ..setup.workloads import Prompt
from ..trust import starvation
from ..trust.phases import InFlight, Phase
from ..trust.starvation import judged_threads
from .records import peak_rss_mb, sampling_params
from .trace import TraceSink


def run_concurrency(rows: Sequence[Phase], encoded: Mapping[Prompt, list[int]], cfg: BenchConfig, arms: list[Arm],
                    on_row: Callable[[dict], None] | None = None, meta: dict | None = None,
                    sink: TraceSink | None = None) -> list[dict]:
    """For each row (T, repeat, N: trust/phases.plan) and method config: the row's prompts
    once each (`encoded` holds their ids), N closed-loop clients (each submits its next
    prompt when its last one finished); throughput and latency/TTFT distributions
    (latency = submit → last token). TTFT is also split: `ttft_first_wave_ms` over the
    first N requests, which all arrive at once (every prompt prefills together), and
    `ttft_steady_ms` over the later ones, which arrive one at a time while the others
    decode (only with more prompts than N). N is never more than the row's prompts; the
    row records the N asked for and the most requests it had in flight.
    With cfg.concurrency_repeats > 1 every (N, config) row runs that many times, a
    whole pass over N at a time, and the arms' order flips from one (repeat, N) to
    the next, so a drift of the machine's speed (±15 % within an hour here) falls on
    AR and the methods alike; analysis/scaling.py pairs the rows of one repeat.
    Every row of every arm runs in a cache scope of its own (Phase.scope): the caches
    the sequential part or another row filled hold every prompt's answer and KV already,
    which would replay. A method that learns across requests learns within the row.
    A starved row is flagged (its "starved" says why), not re-run. `sink` gets each
    request's timeline (TraceSink.concurrency)."""
    out: list[dict] = []
    for j, phase in enumerate(rows):
        order = list(enumerate(arms))
        flip = (phase.repeat + j % len(cfg.concurrency)) % 2  # rows come per (T, repeat) in --concurrency order
        for a, arm in (order[::-1] if flip else order):
            row = _concurrency_row(phase, encoded, cfg, arm, a, meta, sink)
            out.append(row)
            if on_row:
                on_row(row)
    return out


def _concurrency_row(phase: Phase, encoded: Mapping[Prompt, list[int]], cfg: BenchConfig, arm: Arm, a: int,
                     meta: dict | None, sink: TraceSink | None) -> dict:
    """One pass of the row's prompts through an Engine with N clients (run_concurrency)."""
    n, temp, rep = phase.n, phase.temperature, phase.repeat
    spec = arm.spec(phase.scope(a))
    engine = Engine(arm.llm, max_concurrency=n, max_queue=len(phase.prompts) + n)
    jobs = [(encoded[p], sampling_params(cfg, temp, phase.max_new_tokens, cfg.seed + i))
            for i, p in enumerate(phase.prompts)]
    submitted = [0.0] * len(jobs)
    in_flight = InFlight()
    t0, c0 = time.perf_counter(), starvation.cpu_clock()

    def client(i: int) -> GenerationResult:
        with in_flight.request():
            submitted[i] = (time.perf_counter() - t0) * 1000
            return engine.submit(jobs[i][0], jobs[i][1], spec).result()
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(client, range(len(jobs))))
    finally:
        engine.shutdown()
    wall_ms = (time.perf_counter() - t0) * 1000
    cpu_s, threads = starvation.cpu_clock() - c0, judged_threads(arm)
    tokens = sum(r.summary.output_tokens for r in results)
    head = {"concurrency": n, "method": arm.method.name, "k": arm.k, "temperature": temp, "repeat": rep}
    row = {**head, "max_new_tokens": phase.max_new_tokens, "requests": len(results), "output_tokens": tokens,
           "wall_ms": wall_ms, "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
           "latency_ms": distribution([r.summary.wall_ms for r in results]),
           "ttft_ms": distribution([r.summary.ttft_ms for r in results]),
           "ttft_first_wave_ms": distribution([r.summary.ttft_ms for r in results[:n]]),
           "ttft_steady_ms": distribution([r.summary.ttft_ms for r in results[n:]]),
           "peak_rss_mb": peak_rss_mb(), "target": results[0].target, "draft": results[0].draft,
           "cpu_share": cpu_s * 1000 / wall_ms if wall_ms else None, "threads": threads,
           "starved": starvation.starved(cpu_s, wall_ms / 1000, threads, cfg.trust.min_share, os.cpu_count() or 1),
           "concurrency_requested": phase.n_asked, "in_flight_peak": in_flight.peak, **(meta or {}), **arm.meta}
    if sink is not None:
        for i, (prompt, result) in enumerate(zip(phase.prompts, results)):
            sink.concurrency({**head, "order": i, "category": prompt.category, "prompt_index": prompt.index,
                              **(meta or {}), **arm.meta}, submitted[i], result)
    return row
