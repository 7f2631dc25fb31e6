"""The requests of an endpoint bench (bench.py runs them), against one or two servers:
one 8-token warm-up request per server, the latency passes (repeat × T ×
max_new_tokens), then the concurrency rows (T × N). Which prompts each phase sends,
whether it replays prompts its server was sent before, and a row's N:
trust/phases.py.

Order: per prompt, A then B (interleaved, as the local bench runs AR then each
method); per concurrency row, A and B in turn, who goes first alternating.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...loadgen import run_clients
from ..analysis.distributions import distribution
from ..setup.workloads import Prompt
from ..trust.phases import InFlight, Phase
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


def warmup_prompt(first: Prompt) -> Prompt:
    """The warm-up's prompt: the first prompt's text reversed. It goes the same route in
    the same alphabet, yet no phase finds it in a server's caches (trust/phases.py)."""
    return dataclasses.replace(first, prompt=first.prompt[::-1], index=-1)


def run_sequential(run: EndpointRun, passes: Sequence[Phase], cfg, write: Callable[[dict], None]) -> None:
    """One untimed warm-up request per endpoint (8 tokens), then each latency pass: its
    prompts on A then B; identity of B against A at T = 0. Each record names its phase and
    whether it replays prompts its server was sent before."""
    first = passes[0].prompts[0]
    for ep in run.endpoints:
        client.stream_one(ep, warmup_prompt(first), 0.0, min(WARMUP_TOKENS, cfg.max_new_tokens[0]), cfg.seed,
                          cfg.ignore_eos)
    position = {p: i for i, p in enumerate(dict.fromkeys(p for phase in passes for p in phase.prompts))}
    n = 0
    for phase in passes:
        for prompt in phase.prompts:
            seed = cfg.seed + 100_003 * phase.repeat + position[prompt]
            a = None
            for ep in run.endpoints:
                n += 1
                rec = {"request_id": f"e{n:05d}", "repeat": phase.repeat,
                       **client.stream_one(ep, prompt, phase.temperature, phase.max_new_tokens, seed, cfg.ignore_eos),
                       "identity": None, "phase": phase.name, "replay": phase.replay}
                if a is None:
                    a = rec
                elif phase.temperature == 0:
                    rec["identity"] = identity(a, rec)
                run.requests.append(rec)
                write(rec)


def run_concurrency(run: EndpointRun, rows: Sequence[Phase], cfg, on_row: Callable[[dict], None]) -> None:
    """Per row (T × N) and endpoint: the row's prompts once each, N closed-loop clients in
    flight (loadgen.run_clients); the first failure stops the row and is raised. With two
    servers the one that goes first alternates from row to row (A first in the first row;
    a row's record says its `position`), so a drift of the machine's speed falls on both
    alike, as the local bench alternates its arms."""
    for j, phase in enumerate(rows):
        for position, ep in enumerate(run.endpoints if j % 2 == 0 else run.endpoints[::-1], 1):
            in_flight = InFlight()

            def one(item: tuple[int, Prompt]) -> dict:
                i, prompt = item
                with in_flight.request():
                    return client.stream_one(ep, prompt, phase.temperature, phase.max_new_tokens, cfg.seed + i,
                                             cfg.ignore_eos)
            # on a failure: no further requests, only those in flight finish (bounded by the timeout)
            load = run_clients(phase.n, list(enumerate(phase.prompts)), one)
            recs, wall_ms = load.results, load.wall_s * 1000
            tokens = sum(r["output_tokens"] for r in recs)
            row = {"endpoint": ep.label, "url": ep.url, "concurrency": phase.n, "temperature": phase.temperature,
                   "max_new_tokens": phase.max_new_tokens, "requests": len(recs), "output_tokens": tokens,
                   "wall_ms": wall_ms, "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
                   "latency_ms": distribution(r["wall_ms"] for r in recs),
                   "ttft_ms": distribution(r["ttft_ms"] for r in recs),
                   "tpot_ms": distribution(r["tpot_ms"] for r in recs),
                   "itl_ms": distribution(g for r in recs for g in r["itl_ms"]),
                   "concurrency_requested": phase.n_asked, "in_flight_peak": in_flight.peak,
                   "phase": phase.name, "replay": phase.replay, "position": position}
            run.concurrency.append(row)
            on_row(row)
