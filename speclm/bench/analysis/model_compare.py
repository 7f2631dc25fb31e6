"""`speclm models compare`: what a requantised target costs and what it buys.

For each model: file size and type; perplexity on a fixed text set and greedy
agreement with the first (reference) model, teacher-forced on the same tokens
(quality.py); plain-decoding tok/s; and the score-cost curve v(k), the ms to
score a block of k tokens after a 64-token context — the quantity that decides
whether speculation pays on a CPU (docs/design.md#costs). Also the batch noise:
the largest |logit| difference between scoring a block in one forward and token
by token (0 means block forwards are bit-identical to single steps).

Timings are interleaved across the models (round-robin, speclm.costs.time_blocks)
so machine noise hits all alike, and the load average is recorded before and after.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from ...costs import time_blocks
from ...errors import ModelError
from ..output.cells import mib
from ..setup.texts import TEXT_TOKENS, load_texts
from .quality import CONTEXT, Quality, measure_quality, timing_block, v_summary

AR_PROMPTS = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list."""\n',
    "import json\n\n\ndef load_config(path):\n"
    '    """Read a JSON config file and fill in default values."""\n',
)
DEFAULT_KS = tuple(range(1, 17))


def compare_models(a: str, b: str, *more: str, texts: int = 8, n_threads: int | None = None,
                   ks: Sequence[int] = DEFAULT_KS, repeats: int = 3, ar_tokens: int = 64,
                   ar_prompts: Sequence[str] = AR_PROMPTS, quality: bool = True,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Measure ``a``, ``b`` (and any ``more``) — registered names, NAME@QUANT variants or
    GGUF paths — side by side; agreement is against ``a``. Returns a JSON-able dict
    (see module doc): {"models": [...], "reference", "texts", "ks", "loadavg_before", ...}.
    ``quality=False`` skips the perplexity/agreement pass (timings only: perplexity,
    agreement and ar_same_prefix are None)."""
    from speclm.api import LLM, SpecConfig
    from speclm.backends.load import load_backend
    from speclm.models.catalog import resolve_model
    from speclm.sampling import SamplingParams
    from speclm.speculative.identity import batch_noise

    names = [a, b, *more]
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1 or ks[-1] > TEXT_TOKENS - CONTEXT:
        raise ModelError(f"block sizes must be in [1, {TEXT_TOKENS - CONTEXT}], got {ks}")
    if repeats < 1 or ar_tokens < 0 or texts < 0:
        raise ModelError("repeats must be >= 1, ar_tokens and texts >= 0")
    say = progress or (lambda msg: None)
    started = time.perf_counter()
    load_before = list(os.getloadavg())
    paths = [resolve_model(n) for n in names]  # all checked before anything slow
    text_set = load_texts(texts)

    backends = []
    try:
        for name, path in zip(names, paths):
            t0 = time.perf_counter()
            backends.append(load_backend(str(path), TEXT_TOKENS, n_threads, 2))
            say(f"loaded {name} in {time.perf_counter() - t0:.1f} s")
        rows: list[dict] = []
        ref_q: Quality | None = None
        # ---- quality: perplexity and teacher-forced greedy agreement ----
        for name, path, be in zip(names, paths, backends):
            q = measure_quality(be, text_set, ref_q, run=quality)
            ref_q = ref_q or q
            row = {"name": name, "path": str(path), "size": path.stat().st_size, "type": be.describe() if hasattr(be, "describe") else None,
                   "perplexity": q.perplexity, "ppl_tokens": q.ppl_tokens, "quality_s": q.seconds,
                   "same_tokenizer": q.same_tokenizer, "agreement": q.agreement}
            if q.note:
                row["agreement_note"] = q.note
            rows.append(row)
            if quality:
                say(f"{name}: perplexity {row['perplexity']} over {q.ppl_tokens} tokens, agreement {row['agreement']}")
        ref_tokens = ref_q.tokens if ref_q else []

        # ---- costs: v(k), interleaved across models ----
        context, block = timing_block(ref_tokens, ks[-1])
        times = time_blocks(backends, context, block, ks, repeats, say)
        for be, row, tm in zip(backends, rows, times):
            row.update(v_summary(tm))
            noise_k = min(8, ks[-1])
            row["batch_noise"] = batch_noise(be, context, block[:noise_k]) if noise_k > 1 else 0.0
            row["batch_noise_k"] = noise_k

        # ---- plain decoding tok/s, interleaved ----
        if ar_tokens > 0 and ar_prompts:
            llms = [LLM(target=be) for be in backends]  # wraps the loaded backend, loads nothing
            params = SamplingParams(max_new_tokens=ar_tokens, ignore_eos=True)
            out_tokens = [0] * len(backends)
            wall_ms = [0.0] * len(backends)
            decode_ms = [0.0] * len(backends)
            outputs: list[list[list[int]]] = [[] for _ in backends]
            for be in backends:  # warm the decode path once
                seq = be.new_sequence()
                try:
                    be.score(seq, block[:2])
                finally:
                    be.free(seq)
            for p, prompt in enumerate(ar_prompts):
                for i, llm in enumerate(llms):
                    res = llm.generate(prompt, params, SpecConfig(method="ar"))
                    out_tokens[i] += res.summary.output_tokens
                    wall_ms[i] += res.summary.wall_ms
                    decode_ms[i] += res.summary.wall_ms - (res.summary.ttft_ms or 0.0)
                    outputs[i].append(res.token_ids)
                say(f"AR prompt {p + 1}/{len(ar_prompts)} done")
            for i, row in enumerate(rows):
                row["ar_tok_s"] = round(1000.0 * out_tokens[i] / wall_ms[i], 2) if wall_ms[i] else None
                row["ar_tokens"] = out_tokens[i]
                steps = out_tokens[i] - len(ar_prompts)  # tokens after each request's first
                row["ar_decode_tok_s"] = round(1000.0 * steps / decode_ms[i], 2) if decode_ms[i] > 0 else None
                row["ar_same_prefix"] = [_common_prefix(o, r) for o, r in zip(outputs[i], outputs[0])] \
                    if row["same_tokenizer"] else None
        else:
            for row in rows:
                row.update(ar_tok_s=None, ar_decode_tok_s=None, ar_tokens=0, ar_same_prefix=None)
    finally:
        for be in backends:
            be.close()

    load_after = list(os.getloadavg())
    threads = backends[0].n_threads if backends else n_threads
    warnings = []
    if load_before[0] > 0.5:
        warnings.append(f"the machine was busy before the run (1-min load average {load_before[0]:.2f}): "
                        f"timings are unreliable")
    if load_after[0] > (threads or 1) + 0.75:
        warnings.append(f"load average {load_after[0]:.2f} after the run exceeds the {threads} threads "
                        f"used: other processes competed for the cores")
    return {
        "reference": a, "quality": quality,
        "models": rows,
        "texts": {"labels": [label for label, _ in text_set], "humaneval": texts,
                  "tokens": sum(len(t) for t in ref_tokens)},
        "ks": ks, "context_tokens": CONTEXT, "repeats": repeats, "ar_new_tokens": ar_tokens,
        "ar_prompts": len(ar_prompts), "threads": threads,
        "loadavg_before": load_before, "loadavg_after": load_after, "warnings": warnings,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _common_prefix(x: Sequence[int], y: Sequence[int]) -> int:
    n = min(len(x), len(y))
    return next((i for i in range(n) if x[i] != y[i]), n)


def table_rows(result: dict, ks_shown: Sequence[int] | None = None) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the side-by-side table: one column per model, one row per metric."""
    models = result["models"]
    header = ["", *[m["name"] for m in models]]

    def fmt(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = [
        ["type", *[m.get("type") or "-" for m in models]],
        ["size", *[mib(m["size"]) for m in models]],
        [f"perplexity ({models[0]['ppl_tokens']} tok)" if result.get("quality", True) else "perplexity (skipped)", *[fmt(m["perplexity"], ".3f") for m in models]],
        [f"greedy agreement with {result['reference']}", *[fmt(m["agreement"], ".4f") for m in models]],
        [f"AR tok/s ({result['ar_new_tokens']} tok x {result['ar_prompts']})",
         *[fmt(m.get("ar_tok_s"), ".2f") for m in models]],
        ["AR decode tok/s (after 1st token)", *[fmt(m.get("ar_decode_tok_s"), ".2f") for m in models]],
        ["AR same-prefix tokens", *["/".join(map(str, m["ar_same_prefix"])) if m.get("ar_same_prefix") else "-"
                                    for m in models]],
        [f"batch noise (k={models[0]['batch_noise_k']})", *[fmt(m["batch_noise"], ".3g") for m in models]],
    ]
    shown = [str(k) for k in (ks_shown or result["ks"]) if str(k) in models[0]["v_ms"]]
    for k in shown:
        rows.append([f"v({k}) ms", *[fmt(m["v_ms"][k], ".1f") for m in models]])
    if "1" in models[0]["v_ms"]:
        for k in shown:
            if k in ("4", "8", "16"):
                rows.append([f"v({k})/v(1)", *[fmt(m["v_ms"][k] / m["v_ms"]["1"], ".2f") for m in models]])
    return header, rows


def print_table(result: dict, ks_shown: Sequence[int] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    header, rows = table_rows(result, ks_shown)
    table = Table(title="speclm models compare")
    for i, col in enumerate(header):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    lb, la = result["loadavg_before"], result["loadavg_after"]
    console.print(f"threads {result['threads']}; text set {len(result['texts']['labels'])} texts, "
                  f"{result['texts']['tokens']} tokens; v(k): median of {result['repeats']} after "
                  f"{result['context_tokens']} context tokens; load average before "
                  f"{lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f}, after {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f}; "
                  f"{result['elapsed_s']} s", highlight=False)
    for w in result["warnings"]:
        console.print(f"[bold red]warning:[/] {w}", highlight=False)
