"""Sampled generation with the top-k/top-p filters of two commits, in one process.

    python scripts/sampling_filters_e2e.py [OLD_REV]   (default 9fa82cb: before 989f542)

First times target_probs on one synthetic peaked row of Qwen's vocabulary size with
each commit's filters; then loads the shipped target once and generates the same
seeded, sampled request with `ar` and `auto`, swapping speclm.sampling's filters
between OLD_REV's and the working tree's, two passes (docs/results.md#t1). Measure
alone on the machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types

import numpy as np

import speclm.sampling as current
from speclm import LLM, SamplingParams, SpecConfig


def filters_at(rev: str) -> tuple:
    source = subprocess.run(["git", "show", f"{rev}:speclm/sampling.py"], capture_output=True, text=True,
                            check=True).stdout.replace("from .", "from speclm.")
    module = types.ModuleType("sampling_at_rev")
    sys.modules[module.__name__] = module
    exec(compile(source, f"{rev}:speclm/sampling.py", "exec"), module.__dict__)
    return module._keep_top_k, module._keep_top_p


def time_rows(variants: dict[str, tuple], repeats: int = 50) -> None:
    """ms per row of target_probs on 151,936 logits with 50 clear favourites."""
    rng = np.random.default_rng(0)
    row = rng.standard_normal(151_936) * 2
    row[rng.choice(row.size, 50, replace=False)] += 12
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_p=0.95),
                   SamplingParams(temperature=0.7, top_k=40), SamplingParams(temperature=0.7, top_k=40, top_p=0.95)):
        for name, (top_k, top_p) in variants.items():
            current._keep_top_k, current._keep_top_p = top_k, top_p
            t0 = time.perf_counter()
            for _ in range(repeats):
                current.target_probs(row, params)
            print(f"row: {name}: top_k {params.top_k} top_p {params.top_p}: "
                  f"{(time.perf_counter() - t0) / repeats * 1000:.2f} ms", flush=True)


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "9fa82cb"
    variants = {rev: filters_at(rev), "working tree": (current._keep_top_k, current._keep_top_p)}
    time_rows(variants)
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=3, max_new_tokens=96)
    with LLM() as llm:
        for rep in range(2):
            for name, (top_k, top_p) in variants.items():
                current._keep_top_k, current._keep_top_p = top_k, top_p
                for method in ("ar", "auto"):
                    r = llm.generate("def merge_sort(items):", params, SpecConfig(method=method))
                    print(f"pass {rep} {name}: {method} {len(r.token_ids)} tokens, {r.summary.tokens_per_s:.1f} tok/s, "
                          f"{r.summary.rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
