"""What a library user's first `auto` request costs, in a fresh process.

    python scripts/first_request.py [--target NAME] [--tokens 64]

Prints the seconds of `LLM()` (load; the kernel probe only if this machine has no
verdicts for the file yet), of the first `generate(..., SpecConfig())` (default
method auto: the costs it starts from, then the request) and of the same request
again. Run it once to have the probe's verdicts cached, then measure (issue 42:
the first request starts from the probe's cached curve instead of timing v(b)).
Measure alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import time

from speclm import LLM, SamplingParams, SpecConfig

PROMPT = "def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    t0 = time.perf_counter()
    llm = LLM(target=args.target)
    t1 = time.perf_counter()
    params = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    first = llm.generate(PROMPT, params, SpecConfig())
    t2 = time.perf_counter()
    again = llm.generate(PROMPT, params, SpecConfig())
    t3 = time.perf_counter()
    assert first.token_ids == again.token_ids
    print(f"load {t1 - t0:.2f} s, first request {t2 - t1:.2f} s, same request again {t3 - t2:.2f} s "
          f"({len(first.token_ids)} tokens; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
