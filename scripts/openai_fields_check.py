"""What the OpenAI fields cost and whether they stay exact, on a real model
(docs/design.md#processed-distributions).

1. Processors' cost on plain decoding: `ar` decode-only tok/s with and without a
   frequency penalty (and with logprobs=5), interleaved over the prompts and
   repeated; the ratio of medians per setting. A penalty changes the text, so
   each run's rate is its own tokens over its own decode time.
2. Exactness: greedy `auto` given the `ar` answer as its prediction, with
   logprobs=5: identical tokens, and per-token logprobs within batch numerics of
   ar's; echo (prompt_logprobs) against one plain forward over the prompt.

    python scripts/openai_fields_check.py                    # the shipped target
    python scripts/openai_fields_check.py --target smollm2-135m --repeats 1

Measure alone: every other process on the cores inflates the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

from speclm import LLM, SamplingParams, SpecConfig
from speclm.bench.setup.workloads import builtin_prompts
from speclm.sampling import softmax

SETTINGS = {"plain": {}, "frequency_penalty 0.5": {"frequency_penalty": 0.5},
            "presence+frequency+bias": {"presence_penalty": 0.3, "frequency_penalty": 0.5,
                                         "logit_bias": {13: -2.0, 198: 1.0}},
            "logprobs 5": {"logprobs": 5}}


def decode_rate(result) -> float:
    s = result.summary
    decode_ms = s.wall_ms - (s.ttft_ms or 0.0)
    return 1000.0 * (len(result.token_ids) - 1) / decode_ms if decode_ms > 0 else float("nan")


def cost(llm: LLM, prompts: list[list[int]], max_new: int, repeats: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for ids in prompts:
            for name, extra in SETTINGS.items():  # interleaved: noise hits every setting alike
                params = SamplingParams(max_new_tokens=max_new, ignore_eos=True, **extra)
                rates[name].append(decode_rate(llm.generate(ids, params, SpecConfig(method="ar"))))
    return {name: statistics.median(r) for name, r in rates.items()}


def exactness(llm: LLM, prompts: list[list[int]], max_new: int) -> list[dict]:
    out = []
    for ids in prompts:
        params = SamplingParams(max_new_tokens=max_new, logprobs=5)
        ar = llm.generate(ids, params, SpecConfig(method="ar"))
        spec = llm.generate(ids, params, SpecConfig(method="auto"), prediction=ar.token_ids)
        same = min(len(ar.token_ids), len(spec.token_ids))
        n = next((i for i in range(same) if ar.token_ids[i] != spec.token_ids[i]), same)
        diff = max((abs(a.logprob - b.logprob) for a, b in zip(ar.logprobs[:n], spec.logprobs[:n])), default=0.0)
        echo = llm.generate(ids, SamplingParams(max_new_tokens=0, prompt_logprobs=0), SpecConfig(method="ar"))
        seq = llm.target.new_sequence()
        try:
            rows = llm.target.score(seq, ids)
        finally:
            llm.target.free(seq)
        plain = [float(np.log(softmax(rows[i - 1]))[ids[i]]) for i in range(1, len(ids))]
        echo_diff = max(abs(e.logprob - p) for e, p in zip(echo.prompt_logprobs[1:], plain))
        out.append({"tokens": len(ar.token_ids), "identical": ar.token_ids == spec.token_ids,
                    "first_divergence": None if ar.token_ids == spec.token_ids else n,
                    "max_logprob_diff": diff, "echo_max_diff": echo_diff,
                    "accepted_prediction_tokens": spec.prediction.accepted,
                    "speedup": ar.summary.wall_ms / spec.summary.wall_ms})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="model name (default: the shipped target)")
    ap.add_argument("--prompts", type=int, default=4, help="chat prompts (the bench's chat category)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with LLM(target=args.target) as llm:
        prompts = [llm.encode(p.prompt, chat=True) for p in builtin_prompts("chat", args.prompts)]
        llm.warmup(SpecConfig())
        rates = cost(llm, prompts, args.max_new_tokens, args.repeats)
        checks = exactness(llm, prompts, args.max_new_tokens)
    base = rates["plain"]
    print(json.dumps({"load1": os.getloadavg()[0], "decode_tok_s": rates,
                      "ratio_to_plain": {k: v / base for k, v in rates.items()}, "exactness": checks}, indent=1))


if __name__ == "__main__":
    main()
