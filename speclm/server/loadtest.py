"""A bounded load test against a running `speclm serve` (loopback by default).

    python -m speclm.server.loadtest --url http://127.0.0.1:8000 --clients 8,16 --requests 32

N clients each stream completions back to back until `requests` have been
sent in total (bounded in count and in time). Reports throughput (completion
tokens per second of wall time), latency and TTFT percentiles, and errors.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

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


def one_request(client: httpx.Client, url: str, body: dict, headers: dict) -> tuple[float, float, int]:
    """(latency s, ttft s, completion tokens) of one streamed completion."""
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.read()[:200]!r}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"])[:200])
            if ttft is None and chunk["choices"] and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return time.perf_counter() - t0, ttft if ttft is not None else time.perf_counter() - t0, tokens


def run_load(url: str, clients: int, requests: int, max_tokens: int, api_key: str | None,
             speculative: dict | None, time_limit_s: float) -> LoadResult:
    result = LoadResult(clients=clients)
    lock = threading.Lock()
    counter = iter(range(requests))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.perf_counter() + time_limit_s

    def worker() -> None:
        with httpx.Client(timeout=time_limit_s) as client:
            while time.perf_counter() < deadline:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                if speculative:
                    body["speculative"] = speculative
                try:
                    lat, ttft, tokens = one_request(client, url, body, headers)
                    with lock:
                        result.requests += 1
                        result.tokens += tokens
                        result.latency_s.append(lat)
                        result.ttft_s.append(ttft)
                except Exception as exc:  # counted and sampled, never hidden
                    with lock:
                        result.requests += 1
                        result.errors += 1
                        result.error_samples.append(str(exc))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall_s = time.perf_counter() - t0
    return result


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
