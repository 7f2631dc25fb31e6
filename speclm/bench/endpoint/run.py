"""The requests of an endpoint bench (bench.py runs them): the latency phase, then the
concurrency rows, against one or two servers.

Order: per prompt, A then B (interleaved, as the local bench runs AR then each
method). Traffic goes only to the URLs given: one 8-token warm-up request per
server, then the bounded requests (prompts × repeats × T × max_new_tokens, plus
one pass per --concurrency N).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..analysis.distributions import distribution
from ..setup.workloads import Prompt
from . import client
from .client import Endpoint


def identity(a: dict, b: dict) -> dict:
    """B's output against A's for the same prompt at T = 0 (text: the API carries no token ids)."""
    ta, tb = a["text"], b["text"]
    pos = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    if pos is None and len(ta) != len(tb):
        pos = min(len(ta), len(tb))
    return {"identical": pos is None, "first_divergence_char": pos, "compared_tokens": min(
        a["output_tokens"], b["output_tokens"]), "a_tokens": a["output_tokens"], "b_tokens": b["output_tokens"]}


@dataclass
class EndpointRun:
    """What an endpoint bench measured so far (kept when it fails part-way)."""

    endpoints: list[Endpoint]
    requests: list[dict] = field(default_factory=list)
    concurrency: list[dict] = field(default_factory=list)
    metrics_before: dict = field(default_factory=dict)  # label -> scrape
    metrics_after: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    ended: float | None = None
    error: str | None = None


WARMUP_TOKENS = 8


def run_sequential(run: EndpointRun, prompts: Sequence[Prompt], cfg, write: Callable[[dict], None]) -> None:
    """One untimed warm-up request per endpoint (the first prompt, 8 tokens), then every
    prompt × repeat × T × max_new_tokens on A then B; identity of B against A at T = 0."""
    for ep in run.endpoints:
        client.stream_one(ep, prompts[0], 0.0, min(WARMUP_TOKENS, cfg.max_new_tokens[0]), cfg.seed, cfg.ignore_eos)
    n = 0
    for rep in range(cfg.repeats):
        for pi, prompt in enumerate(prompts):
            for temp in cfg.temperatures:
                for max_new in cfg.max_new_tokens:
                    seed = cfg.seed + 100_003 * rep + pi
                    first = None
                    for ep in run.endpoints:
                        n += 1
                        rec = {"request_id": f"e{n:05d}", "repeat": rep,
                               **client.stream_one(ep, prompt, temp, max_new, seed, cfg.ignore_eos), "identity": None}
                        if first is None:
                            first = rec
                        elif temp == 0:
                            rec["identity"] = identity(first, rec)
                        run.requests.append(rec)
                        write(rec)


def run_concurrency(run: EndpointRun, prompts: Sequence[Prompt], cfg, on_row: Callable[[dict], None]) -> None:
    """Per T, N and endpoint: every prompt once with N closed-loop clients in flight."""
    max_new = cfg.max_new_tokens[0]
    for temp in cfg.temperatures:
        for n in cfg.concurrency:
            for ep in run.endpoints:
                jobs = [(p, cfg.seed + i) for i, p in enumerate(prompts)]
                t0 = time.perf_counter()
                pool = ThreadPoolExecutor(max_workers=n)
                try:
                    futures = [pool.submit(client.stream_one, ep, p, temp, max_new, seed, cfg.ignore_eos) for p, seed in jobs]
                    recs = [f.result() for f in futures]
                finally:  # on a failure: no further requests, only those in flight finish (bounded by the timeout)
                    pool.shutdown(wait=True, cancel_futures=True)
                wall_ms = (time.perf_counter() - t0) * 1000
                tokens = sum(r["output_tokens"] for r in recs)
                row = {"endpoint": ep.label, "url": ep.url, "concurrency": n, "temperature": temp,
                       "max_new_tokens": max_new, "requests": len(recs), "output_tokens": tokens, "wall_ms": wall_ms,
                       "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
                       "latency_ms": distribution(r["wall_ms"] for r in recs),
                       "ttft_ms": distribution(r["ttft_ms"] for r in recs),
                       "tpot_ms": distribution(r["tpot_ms"] for r in recs),
                       "itl_ms": distribution(g for r in recs for g in r["itl_ms"])}
                run.concurrency.append(row)
                on_row(row)
