"""speclm's plain decoding (`--method ar`) against llama-cpp-python's own, in one process.

    python scripts/ar_vs_llama_cpp.py [--target NAME] [--tokens 256] [--passes 3] [--threads N]

Both run the same GGUF (the shipped target by default) with the same threads and
kernels (speclm's choice applies process-wide, so llama-cpp-python's `Llama` loaded
after it gets the same switches), greedy, on the same token ids: 8 built-in bench
prompts, short and long. Per pass and prompt the two alternate (which goes first
alternates too); each prints tokens, wall seconds and tokens per second. The summary
is speclm's total tok/s over llama-cpp-python's, per prompt and in all (issue 41's
check: ≥ 0.97×). Measure alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import time

from speclm import LLM, SamplingParams, SpecConfig
from speclm.bench.setup.workloads import load_builtin

CATEGORIES = ["code-edit", "chat", "summarize", "rag-quote", "extract", "math", "translate", "rewrite"]


def speclm_ar(llm: LLM, ids: list[int], n: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    out = llm.generate(ids, SamplingParams(max_new_tokens=n, temperature=0.0), SpecConfig(method="ar"))
    return len(out.token_ids), time.perf_counter() - t0


def llama_cpp_ar(model, ids: list[int], n: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    model.reset()
    count = 0
    for tok in model.generate(ids, temp=0.0, top_k=1, reset=True):
        if model.token_eos() == tok or tok in EOS:
            break
        count += 1
        if count >= n:
            break
    return count, time.perf_counter() - t0


EOS: set[int] = set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    import llama_cpp

    llm = LLM(target=args.target, n_threads=args.threads, max_sequences=1, kernels_for="decoding")
    EOS.update(llm.target.eos_ids)
    model = llama_cpp.Llama(model_path=str(llm.target.path), n_ctx=llm.target.n_ctx, n_threads=args.threads,
                            n_threads_batch=args.threads, n_batch=512, verbose=False)
    prompts = [p for c in CATEGORIES for p in load_builtin([c], 1)]
    ids = [p.encode(llm) for p in prompts]
    choice = llm.target.kernel_choice
    print(f"cpu {os.uname().machine}, load {os.getloadavg()}, threads {args.threads}, "
          f"kernels {choice.name if choice else None}; file {llm.target.path}")
    for tokens in ids[:1]:  # warm both up: page the weights in
        speclm_ar(llm, tokens, 8)
        llama_cpp_ar(model, tokens, 8)
    totals = {p.category: {"speclm": [0, 0.0], "llama-cpp-python": [0, 0.0]} for p in prompts}
    for rep in range(args.passes):
        for i, (p, tokens) in enumerate(zip(prompts, ids)):
            order = [("speclm", speclm_ar, llm), ("llama-cpp-python", llama_cpp_ar, model)]
            for name, run, m in (order if (rep + i) % 2 == 0 else order[::-1]):
                n, s = run(m, tokens, args.tokens)
                totals[p.category][name][0] += n
                totals[p.category][name][1] += s
                print(f"pass {rep + 1} {p.category:10s} prompt {len(tokens):5d} tok  {name:17s} "
                      f"{n:4d} tokens {s:7.2f} s {n / s:6.2f} tok/s", flush=True)
    print("\nper prompt (all passes): speclm tok/s / llama-cpp-python tok/s")
    all_s = {"speclm": [0, 0.0], "llama-cpp-python": [0, 0.0]}
    for cat, t in totals.items():
        a, b = (t[k][0] / t[k][1] for k in ("speclm", "llama-cpp-python"))
        print(f"  {cat:10s} {a:6.2f} / {b:6.2f} = {a / b:.3f}x")
        for k in all_s:
            all_s[k][0] += t[k][0]
            all_s[k][1] += t[k][1]
    a, b = (all_s[k][0] / all_s[k][1] for k in ("speclm", "llama-cpp-python"))
    print(f"  {'all':10s} {a:6.2f} / {b:6.2f} = {a / b:.3f}x   (load after: {os.getloadavg()})")


if __name__ == "__main__":
    main()
