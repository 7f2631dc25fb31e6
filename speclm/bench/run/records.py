"""One request's record: its figures (named as in docs/design.md#metrics), its CPU share
and whether it was starved (trust/starvation.py)."""

from __future__ import annotations

import os
import resource
import time

from ...metrics import GenerationResult
from ...sampling import SamplingParams
from ..analysis.counts import acceptance_from_counts, forced_counts, heads_counts, round_counts, ssd_counts
from ..analysis.validity import answer_valid
from ..setup.workloads import Prompt
from ..trust import starvation
from ..trust.policy import TrustPolicy


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def request_record(result: GenerationResult, meta: dict) -> dict:
    """One request's figures merged into `meta`."""
    s = result.summary
    counts = round_counts(result.rounds)
    acc = acceptance_from_counts(counts)
    wall = s.wall_ms
    return {**meta, "prompt_tokens": result.prompt_tokens, "cached_prompt_tokens": result.cached_prompt_tokens,
            "output_tokens": s.output_tokens,
            "finish_reason": result.finish_reason, "wall_ms": wall, "ttft_ms": s.ttft_ms,
            "tpot_ms": s.tpot_ms, "tokens_per_s": s.tokens_per_s,
            "accepted_progress_per_ms": s.accepted_progress_per_ms, **counts, **acc,
            "prefill_ms": s.prefill_ms, "draft_ms": s.draft_ms, "verify_ms": s.verify_ms,
            "other_ms": s.other_ms,
            # the first round's drafting includes the draft model's own prompt prefill
            "first_round_draft_ms": result.rounds[0].draft_ms if result.rounds else 0.0,
            "first_round_proposed": result.rounds[0].proposed if result.rounds else 0,
            # rounds whose forward also prefilled the prompt's last chunk: verify_ms leaves them out,
            # prefill_ms holds their time, so decode figures count only the tokens after them
            "prompt_rounds": sum(1 for r in result.rounds if r.prompt_rows),
            "decode_tokens": s.output_tokens - sum(r.emitted for r in result.rounds if r.prompt_rows),
            "draft_share": s.draft_ms / wall if wall > 0 else 0.0,
            "verify_share": s.verify_ms / wall if wall > 0 else 0.0,
            "peak_rss_mb": peak_rss_mb(), "load1": os.getloadavg()[0],
            "target": result.target, "draft": result.draft, "text": result.text,
            "token_ids": result.token_ids, **ssd_counts(result.rounds), **heads_counts(result.rounds),
            **forced_counts(result),
            **({"prediction_accepted": result.prediction.accepted, "prediction_rejected": result.prediction.rejected}
               if result.prediction is not None else {})}


def sampling_params(cfg, temperature: float, max_new: int, seed: int) -> SamplingParams:
    """The sampling parameters of a request of BenchConfig `cfg`."""
    return SamplingParams(temperature=temperature, seed=seed, max_new_tokens=max_new, ignore_eos=cfg.ignore_eos)


def timed(arm, scope: str, ids: list[int], params: SamplingParams, head: dict, threads: int | None,
          policy: TrustPolicy, cores: int, prompt: Prompt | None = None) -> tuple[dict, GenerationResult]:
    """One request of `arm` in cache scope `scope` (given the prompt's prediction, which only
    a predicted method reads, and its grammar, which only a constrained one applies), with
    its record, CPU share and starvation verdict (trust/starvation.py); a prompt with a
    grammar also gets whether the answer is valid (analysis/validity.py)."""
    c0, w0 = starvation.cpu_clock(), time.perf_counter()
    result = arm.method.generate(arm.llm, ids, params, arm.spec(scope), prompt and prompt.prediction,
                                 prompt and prompt.grammar)
    cpu_s, wall_s = starvation.cpu_clock() - c0, time.perf_counter() - w0
    rec = request_record(result, head)
    if prompt is not None and prompt.grammar is not None:
        rec["valid"] = answer_valid(prompt, result.text)
    rec.update(cpu_s=cpu_s, cpu_share=cpu_s / wall_s if wall_s > 0 else None, threads=threads,
               starved=starvation.starved(cpu_s, wall_s, threads, policy.min_share, cores), attempt=0,
               rerun_reason=None)
    return rec, result
