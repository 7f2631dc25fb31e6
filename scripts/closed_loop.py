"""Closed-loop clients in process: the engine's side of `speclm.server.loadtest`.

`speclm serve`'s engine (LLM(max_sequences=16, kernels_for="serving",
prefix_cache_tokens=16384), Engine(max_concurrency=16), `auto`, greedy, 48
tokens) answers loadtest's PROMPTS once each, then, as `loadtest --clients
1,CLIENTS --requests REQUESTS` does, one client and then CLIENTS clients each
send the next of REQUESTS requests as their last one ends. Prints each phase's
wall time, tokens per second, TTFT and latency p50, the ratio of the two, and
the first STEPS steps of the last phase: time and each request's block (`--steps`).

    python scripts/closed_loop.py 16 32 --steps 8
"""

import statistics
import sys
import threading
import time

import speclm.engine as engine_module
from speclm import LLM, SamplingParams, SpecConfig
from speclm.engine import Engine
from speclm.server.loadtest import PROMPTS

clients, requests = int(sys.argv[1]), int(sys.argv[2])
show = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 0
steps: list[tuple[float, float, list[int]]] = []
run_step = engine_module.run_step


def timed_step(target, slots, costs=None):
    t = time.perf_counter()
    run_step(target, slots, costs)
    steps.append((t, time.perf_counter(), [len(s.tokens) for s in slots if s.tokens]))


engine_module.run_step = timed_step
llm = LLM(max_sequences=16, kernels_for="serving", prefix_cache_tokens=16384)
eng = Engine(llm, max_concurrency=16)
params, spec = SamplingParams(temperature=0, max_new_tokens=48), SpecConfig()
for p in PROMPTS:
    eng.submit(p, params, spec).result()


def phase(n_clients: int) -> float:
    """REQUESTS requests from n_clients closed-loop clients; prints the phase, returns tok/s."""
    steps.clear()
    todo, lock, out = iter(range(requests)), threading.Lock(), []

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            t0, first = time.perf_counter(), None
            handle = eng.submit(PROMPTS[i % len(PROMPTS)], params, spec)
            for chunk in handle.stream():
                first = first or (chunk and time.perf_counter())
            out.append((first - t0, time.perf_counter() - t0, len(handle.result().token_ids)))

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rate = sum(o[2] for o in out) / wall
    print(f"{n_clients} clients, {requests} requests: wall {wall:.1f} s, {rate:.1f} tok/s, {len(steps)} steps, "
          f"TTFT p50 {statistics.median(o[0] for o in out):.2f} s, latency p50 {statistics.median(o[1] for o in out):.2f} s")
    return rate


one = phase(1)
many = phase(clients)
print(f"{clients} ÷ 1 clients: {many / one:.2f}x")
t0 = steps[0][0] if steps else 0.0
for a, b, blocks in steps[:show]:
    print(f"  step at {a - t0:6.2f} s: {1000 * (b - a):7.1f} ms, blocks {blocks}")
eng.shutdown()
