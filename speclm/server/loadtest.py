"""A bounded load test against a running `speclm serve` (loopback by default).

    python -m speclm.server.loadtest --url http://127.0.0.1:8000 --clients 8,16 --requests 32

N clients each stream completions back to back until `requests` have been
sent in total (bounded in count and in time), through speclm/loadgen.py.
Reports throughput (completion tokens per second of wall time), latency and
TTFT percentiles, and errors.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..loadgen import Request, openai_client, run_clients, timed_request

PROMPTS = [
    "def fibonacci(n):",
    "def is_prime(n):",
    "class LinkedList:\n    def __init__(self):",
    "def merge_sort(items):",
    "import json\n\ndef load_config(path):",
    "def binary_search(arr, target):",
    "def word_count(text):",
    "def flatten(nested):",
]


@dataclass
class LoadResult:
    """One client count's run: requests sent (errors included), completion tokens the
    server reported, and each answered request's latency and TTFT in seconds."""

    clients: int
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    latency_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        def pct(xs: list[float], q: float) -> float | None:
            return float(np.percentile(xs, q)) if xs else None
        return {
            "clients": self.clients, "requests": self.requests, "errors": self.errors,
            "completion_tokens": self.tokens, "wall_s": round(self.wall_s, 2),
            "throughput_tok_s": round(self.tokens / self.wall_s, 2) if self.wall_s else 0.0,
            **{f"latency_p{q}_s": _r(pct(self.latency_s, q)) for q in (50, 95, 99)},
            **{f"ttft_p{q}_s": _r(pct(self.ttft_s, q)) for q in (50, 95, 99)},
            "error_samples": self.error_samples[:3],
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run_load(url: str, clients: int, requests: int, max_tokens: int, api_key: str | None,
             speculative: dict | None, time_limit_s: float) -> LoadResult:
    """`clients` clients stream `requests` completions of PROMPTS in turn (T = 0, no model
    named) at the server's root `url`, for at most `time_limit_s` seconds; a failed
    request is counted and sampled, never raised."""
    client = openai_client(url, api_key, time_limit_s)
    extra = {"speculative": speculative} if speculative else {}
    reqs = [Request(PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, extra=extra) for i in range(requests)]
    load = run_clients(clients, reqs, lambda r: timed_request(client, r, model=None, timeout=time_limit_s),
                       until=time.perf_counter() + time_limit_s, keep_errors=True)
    replies = load.results
    return LoadResult(clients=clients, requests=load.requests, errors=len(load.errors),
                      tokens=sum(r.completion_tokens or 0 for r in replies), wall_s=load.wall_s,
                      latency_s=[r.latency_s for r in replies],
                      ttft_s=[r.ttft_s if r.ttft_s is not None else r.latency_s for r in replies],
                      error_samples=[str(e) for e in load.errors])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="bounded load test of a speclm server")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--clients", default="8,16", help="comma-separated client counts, run in turn")
    p.add_argument("--requests", type=int, default=32, help="requests per client count")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--method", default=None, help="speculative method override per request")
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per client count")
    p.add_argument("--api-key", default=os.environ.get("SPECLM_API_KEY"))
    args = p.parse_args(argv)
    spec = {k: v for k, v in (("method", args.method), ("k", args.k)) if v is not None} or None
    load = os.getloadavg()
    print(json.dumps({"loadavg_before": load}))
    for n in (int(x) for x in args.clients.split(",")):
        res = run_load(args.url, n, args.requests, args.max_tokens, args.api_key, spec, args.time_limit)
        print(json.dumps(res.summary()))
    print(json.dumps({"loadavg_after": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
