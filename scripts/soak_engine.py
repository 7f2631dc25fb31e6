"""Memory soak of the engine alone (no HTTP): what RSS glibc could give back.

soak.py's workload (SmolLM2-135M, 4 clients, distinct prompts, 48 tokens at
T 0.7, suffix cache bound 4,000 tokens, prefix cache 2,000) run in this
process; every EVERY requests it prints RSS, RSS after glibc's malloc_trim(0)
and the number of objects the garbage collector tracks. Flat objects and a
flat trimmed RSS while the untrimmed one creeps: the creep is freed memory
the allocator keeps, not objects kept per request. With `--observe` it prints
RSS without trimming anything itself: what a server's memory does with the
engine's own returns of freed memory (speclm.engine, docs/results.md#u6).

    python scripts/soak_engine.py 3000 250 [--observe]
"""

import ctypes
import gc
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from soak import prompts, rss_mb  # noqa: E402

from speclm import LLM, SamplingParams, SpecConfig  # noqa: E402
from speclm.engine import Engine  # noqa: E402

libc = ctypes.CDLL("libc.so.6")
total, every = int(sys.argv[1]), int(sys.argv[2])
observe = "--observe" in sys.argv[3:]
llm = LLM("smollm2-135m", n_ctx=512, max_sequences=4, suffix_cache_tokens=4000, prefix_cache_tokens=2000,
          kernels_for="serving")
eng = Engine(llm, max_concurrency=4)
gen, lock, sent = prompts(0), threading.Lock(), [0]


def client() -> None:
    while True:
        with lock:
            if sent[0] >= total:
                return
            req = next(gen)
            sent[0] += 1
            n = sent[0]
        eng.submit(req.prompt, SamplingParams(temperature=0.7, max_new_tokens=48), SpecConfig()).result()
        if n % every == 0:
            gc.collect()
            before = rss_mb(os.getpid())
            if not observe:
                libc.malloc_trim(0)
            after = rss_mb(os.getpid())
            print(f"{n} {time.strftime('%H:%M:%S')} rss {before:.1f}"
                  f"{'' if observe else f' after_trim {after:.1f}'} objects {len(gc.get_objects())}", flush=True)


threads = [threading.Thread(target=client) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
eng.shutdown()
