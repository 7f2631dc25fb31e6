"""The benchmark sweep: methods × K × temperature × max_new_tokens × repeats.

Fairness: one process, one warm-up generation per method first, then per
repeat and per prompt the AR baseline runs first and every method config
right after it on the same prompt, so machine noise hits all alike. Every
request yields one record (see `request_record`) and its per-round trace;
a `TraceSink` streams both to JSONL once the request is final.

Contamination (contamination.py, reruns.py): after the warm-up the run waits
(bounded) for a quiet machine; every request records its process CPU share
(CPU s / wall s) and is flagged as starved when that falls well below the
threads it computes with; starved requests run again, with their AR partner,
in re-run passes after the sweep (bounded per request and in all). Records
are written in run order; a unit waiting for a re-run holds back the ones
after it.

Order (`run_order`): a category's prompts run as a sequence, contiguous and
in index (file) order, categories in the order first given; every repeat
runs the whole sequence again. A cross-request cache therefore sees prompt
i before prompt i + 1, and the report's first-half / second-half split
(halves.py) shows what it learned.

Concurrency mode keeps N requests in flight through `speclm.engine.Engine`
(N closed-loop clients: each submits its next prompt when its last finishes).
The LLM must hold at least N sequences (LLM(max_sequences=N)).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..api import LLM
from ..engine import Engine
from ..errors import InvalidRequestError
from ..metrics import GenerationResult
from ..sampling import SamplingParams
from ..speculative.identity import compare_greedy
from .records import peak_rss_mb, timed
from .analysis.distributions import distribution
from .setup.config import Arm, BenchConfig, make_arms
from .setup.methods import BASELINE
from .trust import starvation
from .trust.quiet import after_wait, busy_during, busy_warning, wait_for_quiet
from .trust.reruns import RerunQueue, Slot, Unit, rerunnable
from .trust.starvation import judged_threads, starved, starved_warnings
from .setup.workloads import Prompt

WARMUP_TOKENS = 8


@dataclass
class BenchRun:
    """Everything a sweep measured, ready for summary.build_summary."""

    requests: list[dict]
    concurrency: list[dict]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    started: float  # epoch seconds
    ended: float
    warnings: list[str]


class TraceSink:
    """Streams per-round lines to rounds.jsonl and per-request lines to requests.jsonl
    (the attempt kept), and superseded attempts to reruns.jsonl."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self._rounds: IO[str] = open(out_dir / "rounds.jsonl", "w", encoding="utf-8")
        self._requests: IO[str] = open(out_dir / "requests.jsonl", "w", encoding="utf-8")
        self._dir, self._reruns, self._conc = out_dir, None, None

    def write(self, record: dict, result: GenerationResult) -> None:
        keys = ("request_id", "category", "method", "k", "temperature", "max_new_tokens",
                "prompt_index", "repeat", "target_name", "draft_name")
        head = {key: record[key] for key in keys if key in record}
        for i, r in enumerate(result.rounds):
            self._rounds.write(json.dumps({**head, "round": i, **r.to_dict()}) + "\n")
        self._requests.write(json.dumps(record) + "\n")
        self._rounds.flush()
        self._requests.flush()

    def concurrency(self, head: dict, submitted_ms: float, result: GenerationResult) -> None:
        """One request of a concurrency row (concurrency.jsonl, opened on first use): when it
        was submitted (ms after the row started), queued, prefilled and got its first token,
        and each round's end, block and accepted drafts, so a TTFT can be traced."""
        if self._conc is None:
            self._conc = open(self._dir / "concurrency.jsonl", "w", encoding="utf-8")
        s = result.summary
        self._conc.write(json.dumps({
            **head, "submitted_ms": submitted_ms, "queued_ms": s.queued_ms, "prefill_ms": s.prefill_ms,
            "ttft_ms": s.ttft_ms, "wall_ms": s.wall_ms, "prompt_tokens": result.prompt_tokens,
            "cached_prompt_tokens": result.cached_prompt_tokens, "output_tokens": s.output_tokens,
            "rounds": [[r.at_ms, r.proposed, r.accepted, r.verify_ms, r.batch_tokens] for r in result.rounds],
        }) + "\n")
        self._conc.flush()

    def superseded(self, record: dict) -> None:
        """A starved attempt that a re-run replaced (reruns.jsonl, opened on first use)."""
        if self._reruns is None:
            self._reruns = open(self._dir / "reruns.jsonl", "w", encoding="utf-8")
        self._reruns.write(json.dumps(record) + "\n")
        self._reruns.flush()

    def close(self) -> None:
        self._rounds.close()
        self._requests.close()
        for extra in (self._reruns, self._conc):
            if extra is not None:
                extra.close()


def _params(cfg: BenchConfig, temperature: float, max_new: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_new_tokens=max_new,
                          ignore_eos=cfg.ignore_eos)


def run_order(prompts: Sequence[Prompt]) -> list[Prompt]:
    """`prompts` as they run: grouped by category (first-seen order), each category in
    index order. A list from workloads.select is already in this order and stays as is."""
    rank = {c: i for i, c in enumerate(dict.fromkeys(p.category for p in prompts))}
    return sorted(prompts, key=lambda p: (rank[p.category], p.index))  # stable: equal indices keep their order


def encode_prompts(llm: LLM, prompts: Sequence[Prompt], max_new: int) -> list[list[int]]:
    """Token ids per prompt; a prompt that cannot fit with max_new tokens fails up front."""
    out = []
    for p in prompts:
        ids = llm.encode(list(p.prompt) if not isinstance(p.prompt, str) else p.prompt, chat=p.chat)
        if len(ids) + max_new >= llm.target.n_ctx:
            raise InvalidRequestError(
                f"{p.category} prompt {p.index} is {len(ids)} tokens; with {max_new} new tokens it does not "
                f"fit the context of {llm.target.n_ctx}: raise --n-ctx or lower --max-new-tokens")
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


def run_bench(llm: LLM, prompts: Sequence[Prompt], cfg: BenchConfig, sink: TraceSink | None = None,
              on_request: Callable[[dict], None] | None = None,
              on_concurrency: Callable[[dict], None] | None = None, *, arms: list[Arm] | None = None,
              meta: dict | None = None, first_id: int = 0) -> BenchRun:
    """Run the sweep. `on_request` sees each record once it is final (progress bars). `arms`
    (default make_arms(cfg, llm)) all share `llm`'s target; `meta` is merged into every
    record and request ids count on from `first_id` (a variant sweep calls this per target).
    Starved requests are re-run after the sweep (contamination.py, reruns.py); what the
    check saw is appended to cfg.observed."""
    if not prompts:
        raise InvalidRequestError("no prompts to benchmark: check --categories / --dataset")
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    warnings = [w for w in [busy_warning(load_before[0], cores)] if w]
    started = time.time()
    arms = arms if arms is not None else make_arms(cfg, llm)
    prompts = run_order(prompts)
    encoded = encode_prompts(llm, prompts, max(cfg.max_new_tokens))
    warmup(arms, encoded[0])
    policy = cfg.trust
    # after the warm-up, right before the timed requests; a sweep's later targets wait too,
    # since the load the previous target's own threads left behind would read as "busy"
    wait = wait_for_quiet(policy, cores)
    cfg.observed.waits.append(wait)
    warnings = after_wait(warnings, wait)
    threads = [judged_threads(a) for a in arms]
    again = [rerunnable(a) for a in arms]
    records: list[dict] = []

    def finalize(unit: Unit) -> None:
        ids, params = unit.context
        ar = next((s for s in unit.slots if s.baseline), None)
        for s in unit.slots:
            rec, result = s.attempts[-1]
            rec["identity"] = None
            if params.greedy and not s.baseline and ar is not None:
                rec["identity"] = compare_greedy(llm.target, ids, ar.result.token_ids, result.token_ids).to_dict()
            records.append(rec)
            if sink:
                sink.write(rec, result)
            if on_request:
                on_request(rec)

    def rerun(unit: Unit, slot: Slot, reason: str) -> tuple[dict, GenerationResult]:
        ids, params = unit.context
        rec, result = timed(arms[slot.arm_index], f"bench-arm{slot.arm_index}", ids, params, slot.head,
                            threads[slot.arm_index], policy, cores)
        rec["rerun_reason"] = reason
        return rec, result

    n_planned = len(prompts) * cfg.repeats * len(cfg.temperatures) * len(cfg.max_new_tokens) * len(arms)
    queue = RerunQueue(policy, policy.total_cap(n_planned), cfg.observed, rerun, finalize,
                       superseded=sink.superseded if sink else None)
    n = first_id
    for rep in range(cfg.repeats):
        for pi, (prompt, ids) in enumerate(zip(prompts, encoded)):
            for temp in cfg.temperatures:
                for max_new in cfg.max_new_tokens:
                    seed = cfg.seed + 100_003 * rep + pi
                    params = _params(cfg, temp, max_new, seed)
                    unit = Unit([], context=(ids, params))
                    for ai, arm in enumerate(arms):
                        n += 1
                        head = {"request_id": f"r{n:05d}", "category": prompt.category,
                                "prompt_index": prompt.index, "repeat": rep, "method": arm.method.name,
                                "k": arm.k, "temperature": temp, "max_new_tokens": max_new,
                                "seed": seed, "chat": prompt.chat, **(meta or {}), **arm.meta}
                        rec, result = timed(arm, f"bench-arm{ai}", ids, params, head, threads[ai], policy, cores)
                        unit.slots.append(Slot(ai, arm.method.name == BASELINE, again[ai], [(rec, result)], head))
                    queue.add(unit)
    queue.finish()
    conc = run_concurrency(prompts, encoded, cfg, arms, on_concurrency, meta, sink) if cfg.concurrency else []
    warnings += starved_warnings(records, conc)
    load_after = os.getloadavg()
    own = max((t for t in threads if t), default=0)  # the load this bench's own llama.cpp threads make
    warnings += busy_during(warnings, [load_after[0], *(r["load1"] for r in records)], own, cores)
    return BenchRun(records, conc, load_before, load_after, started, time.time(), warnings)


def run_concurrency(prompts: Sequence[Prompt], encoded: list[list[int]], cfg: BenchConfig, arms: list[Arm],
                    on_row: Callable[[dict], None] | None = None, meta: dict | None = None,
                    sink: TraceSink | None = None) -> list[dict]:
    """For each T, repeat, N and method config: every prompt once, N closed-loop
    clients (each submits its next prompt when its last one finished); throughput and
    latency/TTFT distributions (latency = submit → last token). TTFT is also split:
    `ttft_first_wave_ms` over the first N requests, which all arrive at once (every
    prompt prefills together), and `ttft_steady_ms` over the later ones, which
    arrive one at a time while the others decode (only with more prompts than N).
    With cfg.concurrency_repeats > 1 every (N, config) row runs that many times, a
    whole pass over N at a time, and the arms' order flips from one (repeat, N) to
    the next, so a drift of the machine's speed (±15 % within an hour here) falls on
    AR and the methods alike; scaling.py pairs the rows of one repeat.
    A method that learns across requests (suffix decoding) starts each row with an
    empty cache of its own (per arm and repeat) and learns within the row: the cache
    the sequential part, or another row, filled holds every prompt's answer already,
    which would replay.
    A starved row is flagged (its "starved" says why), not re-run. `sink` gets each
    request's timeline (TraceSink.concurrency)."""
    rows: list[dict] = []
    for temp in cfg.temperatures:
        for rep in range(cfg.concurrency_repeats):
            for i, n in enumerate(cfg.concurrency):
                order = list(enumerate(arms))
                for a, arm in (order if (rep + i) % 2 == 0 else order[::-1]):
                    row = _concurrency_row(prompts, encoded, cfg, arm, a, n, temp, rep, meta, sink)
                    rows.append(row)
                    if on_row:
                        on_row(row)
    return rows


def _concurrency_row(prompts: Sequence[Prompt], encoded: list[list[int]], cfg: BenchConfig, arm: Arm, a: int,
                     n: int, temp: float, rep: int, meta: dict | None, sink: TraceSink | None) -> dict:
    """One pass of every prompt through an Engine with `n` clients (run_concurrency)."""
    method, k, max_new = arm.method, arm.k, cfg.max_new_tokens[0]
    # its own caches: the sequential part's or another row's outputs (suffix cache) and prompts
    # (prompt KV copies) would replay, for AR too
    spec = dataclasses.replace(method.spec(k), cache_scope=f"bench-concurrency-arm{a}-{n}-T{temp:g}-r{rep}")
    engine = Engine(arm.llm, max_concurrency=n, max_queue=len(encoded) + n)
    jobs = [(ids, _params(cfg, temp, max_new, cfg.seed + i)) for i, ids in enumerate(encoded)]
    submitted = [0.0] * len(jobs)
    t0, c0 = time.perf_counter(), starvation.cpu_clock()

    def client(i: int) -> GenerationResult:
        submitted[i] = (time.perf_counter() - t0) * 1000
        return engine.submit(jobs[i][0], jobs[i][1], spec).result()
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(client, range(len(jobs))))
    finally:
        engine.shutdown()
    wall_ms = (time.perf_counter() - t0) * 1000
    cpu_s, threads = starvation.cpu_clock() - c0, judged_threads(arm)
    tokens = sum(r.summary.output_tokens for r in results)
    head = {"concurrency": n, "method": method.name, "k": k, "temperature": temp, "repeat": rep}
    row = {**head, "max_new_tokens": max_new, "requests": len(results), "output_tokens": tokens,
           "wall_ms": wall_ms, "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
           "latency_ms": distribution([r.summary.wall_ms for r in results]),
           "ttft_ms": distribution([r.summary.ttft_ms for r in results]),
           "ttft_first_wave_ms": distribution([r.summary.ttft_ms for r in results[:n]]),
           "ttft_steady_ms": distribution([r.summary.ttft_ms for r in results[n:]]),
           "peak_rss_mb": peak_rss_mb(), "target": results[0].target, "draft": results[0].draft,
           "cpu_share": cpu_s * 1000 / wall_ms if wall_ms else None, "threads": threads,
           "starved": starved(cpu_s, wall_ms / 1000, threads, cfg.trust.min_share, os.cpu_count() or 1),
           **(meta or {}), **arm.meta}
    if sink is not None:
        for i, (prompt, result) in enumerate(zip(prompts, results)):
            sink.concurrency({**head, "order": i, "category": prompt.category, "prompt_index": prompt.index,
                              **(meta or {}), **arm.meta}, submitted[i], result)
    return row
