"""The sequential sweep: methods × K × temperature × max_new_tokens × repeats.

Fairness: one process, one warm-up generation per method first, then per
repeat and per prompt the AR baseline runs first and every method config
right after it on the same prompt, so machine noise hits all alike. Every
request yields one record (records.py) and its per-round trace; a
`TraceSink` (trace.py) streams both to JSONL once the request is final.

Trust (docs/bench.md#trust): after the warm-up the run waits (bounded) for a
quiet machine (trust/quiet.py); every request records its process CPU share
and is flagged when starved (trust/starvation.py); starved requests run again,
with their AR partner, in re-run passes after the sweep (trust/reruns.py); the
pipeline's trust stage warns of those still starved.
Records are written in run order; a unit waiting for a re-run holds back the
ones after it.

Order (`run_order`): a category's prompts run as a sequence, contiguous and
in index (file) order, categories in the order first given; every repeat
runs the whole sequence again. A cross-request cache therefore sees prompt
i before prompt i + 1, and the report's first-half / second-half split
(analysis/halves.py) shows what it learned. Each pass (repeat × T ×
max_new_tokens) runs every arm in a cache scope of its own
(trust/phases.py), so a repeat learns the sequence anew instead of replaying
the answers of the pass before. Then the concurrency rows (concurrent.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...api import LLM
from ...errors import InvalidRequestError
from ...speculative.loop import context_problem
from ...metrics import GenerationResult
from ...sampling import SamplingParams
from ...speculative.identity import compare_to_ar
from ..setup.config import Arm, BenchConfig
from ..setup.methods import BASELINE, SCHEMA_BASELINE
from ..setup.workloads import Prompt
from ..trust import phases
from ...machine import busy_warning
from ..trust.quiet import after_wait, busy_during, wait_for_quiet
from ..trust.reruns import RerunQueue, RerunSlot, Unit, rerunnable
from ..trust.starvation import judged_threads
from .concurrent import run_concurrency
from .records import sampling_params, timed
from .trace import TraceSink

WARMUP_TOKENS = 8


@dataclass
class BenchRun:
    """Everything a sweep measured, ready for the report (output/report.py)."""

    requests: list[dict]
    concurrency: list[dict]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    started: float  # epoch seconds
    ended: float
    warnings: list[str]


def run_order(prompts: Sequence[Prompt]) -> list[Prompt]:
    """`prompts` as they run: grouped by category (first-seen order), each category in
    index order. A list from workloads.select is already in this order and stays as is."""
    rank = {c: i for i, c in enumerate(dict.fromkeys(p.category for p in prompts))}
    return sorted(prompts, key=lambda p: (rank[p.category], p.index))  # stable: equal indices keep their order


def encode_prompts(llm: LLM, prompts: Sequence[Prompt], max_new: int) -> list[list[int]]:
    """Token ids per prompt; a prompt that cannot fit with max_new tokens fails up front."""
    out = []
    for p in prompts:
        ids = p.encode(llm)
        if problem := context_problem(llm.target.n_ctx, len(ids), max_new):
            raise InvalidRequestError(f"{p.category} prompt {p.index}: {problem[0]}: raise --n-ctx or lower "
                                      f"--max-new-tokens")
        out.append(ids)
    return out


def warmup(arms: list[Arm], ids: list[int]) -> None:
    """Map the models in and run one short untimed generation per method and LLM (on
    the first 32 tokens of a prompt: it pages weights in, it need not be a full prefill)."""
    ids = ids[:32] if len(ids) > 32 else ids
    done: set[tuple[str, int]] = set()
    for arm in arms:
        spec = arm.method.spec(arm.k)
        arm.llm.warmup(spec)
        if (arm.method.name, id(arm.llm)) not in done:
            arm.method.generate(arm.llm, ids, SamplingParams(max_new_tokens=WARMUP_TOKENS), spec)
            done.add((arm.method.name, id(arm.llm)))


def run_bench(llm: LLM, prompts: Sequence[Prompt], cfg: BenchConfig, arms: list[Arm], sink: TraceSink | None = None,
              on_request: Callable[[dict], None] | None = None,
              on_concurrency: Callable[[dict], None] | None = None, *, meta: dict | None = None, first_id: int = 0,
              encoded: dict[Prompt, list[int]] | None = None) -> BenchRun:
    """Run the sweep of `arms` (setup/config.make_arms), which all share `llm`'s target.
    `on_request` sees each record once it is final (progress bars); `meta` is merged into
    every record and request ids count on from `first_id` (a variant sweep calls this per target).
    `encoded`: each prompt's token ids where the caller has them (encode_prompts), else
    encoded here.
    Starved requests are re-run after the sweep (trust/reruns.py); what the trust checks
    saw is appended to cfg.observed."""
    if not prompts:
        raise InvalidRequestError("no prompts to benchmark: check --categories / --dataset")
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    started = time.time()
    prompts = run_order(prompts)
    ids_of = encoded or dict(zip(prompts, encode_prompts(llm, prompts, max(cfg.max_new_tokens))))
    warmup(arms, ids_of[prompts[0]])
    policy = cfg.trust
    # after the warm-up, right before the timed requests: its first reading is the start's
    wait = wait_for_quiet(policy, cores)
    cfg.observed.waits.append(wait)
    warnings = after_wait([w for w in [busy_warning(wait["loads"][0][1], cores)] if w], wait)
    threads = [judged_threads(a) for a in arms]
    records: list[dict] = []

    def finalize(unit: Unit) -> None:
        ids, params = unit.context[:2]
        by_name = {arms[s.arm_index].method.name: s for s in unit.slots}
        for s in unit.slots:
            rec, result = s.attempts[-1]
            rec["identity"] = None
            ar = by_name.get(arms[s.arm_index].method.baseline)  # AR, or constrained AR for a +schema method
            if params.greedy and not s.baseline and ar is not None and ar is not s:
                rec["identity"] = compare_to_ar(llm.target, ids, ar.result.token_ids, result.token_ids).to_dict()
            records.append(rec)
            if sink:
                sink.write(rec, result)
            if on_request:
                on_request(rec)

    def rerun(unit: Unit, slot: RerunSlot, reason: str) -> tuple[dict, GenerationResult]:
        ids, params, phase, prompt = unit.context
        rec, result = timed(arms[slot.arm_index], phase.scope(slot.arm_index), ids, params, slot.head,
                            threads[slot.arm_index], policy, cores, prompt)
        rec["rerun_reason"] = reason
        return rec, result

    again = [rerunnable(a) for a in arms]
    cap = policy.total_cap(cfg.planned_requests(len(prompts), len(arms)))
    queue = RerunQueue(policy, cap, cfg.observed, rerun, finalize, superseded=sink.superseded if sink else None)
    passes, rows = phases.plan(prompts, cfg, forgets=True)  # each phase and arm in a cache scope of its own
    warnings += phases.warnings(passes + rows)
    pass_of = {(p.repeat, p.temperature, p.max_new_tokens): p for p in passes}
    n = first_id
    for rep in range(cfg.repeats):
        for pi, prompt in enumerate(prompts):
            ids = ids_of[prompt]
            for temp in cfg.temperatures:
                for max_new in cfg.max_new_tokens:
                    seed = cfg.seed + 100_003 * rep + pi
                    params = sampling_params(cfg, temp, max_new, seed)
                    phase = pass_of[(rep, temp, max_new)]
                    unit = Unit([], context=(ids, params, phase, prompt))
                    for ai, arm in enumerate(arms):
                        n += 1
                        head = {"request_id": f"r{n:05d}", "category": prompt.category,
                                "prompt_index": prompt.index, "repeat": rep, "method": arm.method.name,
                                "k": arm.k, "temperature": temp, "max_new_tokens": max_new,
                                "seed": seed, "chat": prompt.chat, **(meta or {}), **arm.meta}
                        rec, result = timed(arm, phase.scope(ai), ids, params, head, threads[ai], policy, cores,
                                            prompt)
                        base = arm.method.name in (BASELINE, SCHEMA_BASELINE)
                        unit.slots.append(RerunSlot(ai, base, again[ai], [(rec, result)], head))
                    queue.add(unit)
    queue.finish()
    conc = run_concurrency(rows, ids_of, cfg, arms, on_concurrency, meta, sink)
    load_after = os.getloadavg()
    own = max((t for t in threads if t), default=0)  # the load this bench's own llama.cpp threads make
    warnings += busy_during(warnings, [load_after[0], *(r["load1"] for r in records)], own, cores)
    return BenchRun(records, conc, load_before, load_after, started, time.time(), warnings)
