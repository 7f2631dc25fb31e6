"""The concurrency rows of the in-process bench: N closed-loop clients through
`speclm.engine.Engine` (each submits its next prompt when its last one finished). The LLM
must hold at least N sequences (LLM(max_sequences=N))."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ...engine import Engine
from ...metrics import GenerationResult
from ..analysis.distributions import distribution
from ..setup.config import Arm, BenchConfig
from ..setup.workloads import Prompt
from ..trust import starvation
from ..trust.starvation import judged_threads
from .records import peak_rss_mb, sampling_params
from .trace import TraceSink


def run_concurrency(prompts: Sequence[Prompt], encoded: list[list[int]], cfg: BenchConfig, arms: list[Arm],
                    on_row: Callable[[dict], None] | None = None, meta: dict | None = None,
                    sink: TraceSink | None = None) -> list[dict]:
    """For each T, repeat, N and method config: every prompt once, N closed-loop
    clients (each submits its next prompt when its last one finished); throughput and
    latency/TTFT distributions (latency = submit → last token). TTFT is also split:
    `ttft_first_wave_ms` over the first N requests, which all arrive at once (every
    prompt prefills together), and `ttft_steady_ms` over the later ones, which
    arrive one at a time while the others decode (only with more prompts than N).
    With cfg.concurrency_repeats > 1 every (N, config) row runs that many times, a
    whole pass over N at a time, and the arms' order flips from one (repeat, N) to
    the next, so a drift of the machine's speed (±15 % within an hour here) falls on
    AR and the methods alike; analysis/scaling.py pairs the rows of one repeat.
    A method that learns across requests (suffix decoding) starts each row with an
    empty cache of its own (per arm and repeat) and learns within the row: the cache
    the sequential part, or another row, filled holds every prompt's answer already,
    which would replay.
    A starved row is flagged (its "starved" says why), not re-run. `sink` gets each
    request's timeline (TraceSink.concurrency)."""
    rows: list[dict] = []
    for temp in cfg.temperatures:
        for rep in range(cfg.concurrency_repeats):
            for i, n in enumerate(cfg.concurrency):
                order = list(enumerate(arms))
                for a, arm in (order if (rep + i) % 2 == 0 else order[::-1]):
                    row = _concurrency_row(prompts, encoded, cfg, arm, a, n, temp, rep, meta, sink)
                    rows.append(row)
                    if on_row:
                        on_row(row)
    return rows


def _concurrency_row(prompts: Sequence[Prompt], encoded: list[list[int]], cfg: BenchConfig, arm: Arm, a: int,
                     n: int, temp: float, rep: int, meta: dict | None, sink: TraceSink | None) -> dict:
    """One pass of every prompt through an Engine with `n` clients (run_concurrency)."""
    method, k, max_new = arm.method, arm.k, cfg.max_new_tokens[0]
    # its own caches: the sequential part's or another row's outputs (suffix cache) and prompts
    # (prompt KV copies) would replay, for AR too
    spec = arm.spec(f"bench-concurrency-arm{a}-{n}-T{temp:g}-r{rep}")
    engine = Engine(arm.llm, max_concurrency=n, max_queue=len(encoded) + n)
    jobs = [(ids, sampling_params(cfg, temp, max_new, cfg.seed + i)) for i, ids in enumerate(encoded)]
    submitted = [0.0] * len(jobs)
    t0, c0 = time.perf_counter(), starvation.cpu_clock()

    def client(i: int) -> GenerationResult:
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
    head = {"concurrency": n, "method": method.name, "k": k, "temperature": temp, "repeat": rep}
    row = {**head, "max_new_tokens": max_new, "requests": len(results), "output_tokens": tokens,
           "wall_ms": wall_ms, "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
           "latency_ms": distribution([r.summary.wall_ms for r in results]),
           "ttft_ms": distribution([r.summary.ttft_ms for r in results]),
           "ttft_first_wave_ms": distribution([r.summary.ttft_ms for r in results[:n]]),
           "ttft_steady_ms": distribution([r.summary.ttft_ms for r in results[n:]]),
           "peak_rss_mb": peak_rss_mb(), "target": results[0].target, "draft": results[0].draft,
           "cpu_share": cpu_s * 1000 / wall_ms if wall_ms else None, "threads": threads,
           "starved": starvation.starved(cpu_s, wall_ms / 1000, threads, cfg.trust.min_share, os.cpu_count() or 1),
           **(meta or {}), **arm.meta}
    if sink is not None:
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            sink.concurrency({**head, "order": i, "category": prompt.category, "prompt_index": prompt.index,
                              **(meta or {}), **arm.meta}, submitted[i], result)
    return row
