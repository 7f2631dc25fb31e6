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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from ..api import LLM, SpecConfig
from ..engine import Engine
from ..errors import InvalidRequestError
from ..metrics import GenerationResult
from ..prefix_cache import PREFIX_CACHE_TOKENS
from ..sampling import SamplingParams
from ..speculative.identity import compare_greedy
from . import contamination
from .contamination import TrustLog, TrustPolicy, starved, wait_for_quiet
from .methods import BASELINE, BENCH_DEFAULT, BenchMethod, parse_methods
from .records import expected_threads, learns_across_requests, peak_rss_mb, timed
from .records import request_record, ssd_counts  # noqa: F401  (public here too)
from .report import distribution
from .reruns import RerunQueue, Slot, Unit
from .workloads import Prompt

WARMUP_TOKENS = 8


@dataclass
class BenchConfig:
    """What to sweep. Every list is swept; AR runs once per (prompt, repeat, T, N)."""

    methods: list[str] = field(default_factory=lambda: list(BENCH_DEFAULT))
    ks: list[int] = field(default_factory=lambda: [2, 4, 8])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: list[int] = field(default_factory=lambda: [128])
    repeats: int = 1
    seed: int = 0
    concurrency: list[int] = field(default_factory=list)
    concurrency_repeats: int = 1  # passes over every concurrency row, AR and methods alternating who runs first
    ignore_eos: bool = False
    prefix_cache_tokens: int = PREFIX_CACHE_TOKENS  # each arm's own prompt KV cache (run_sweep's LLMs)
    base: SpecConfig = field(default_factory=SpecConfig)  # the settings no sweep dimension sets
    trust: TrustPolicy = field(default_factory=TrustPolicy)  # contamination check and quiet wait
    observed: TrustLog = field(default_factory=TrustLog, compare=False)  # what they saw (all runs of it)

    def configs(self) -> list[tuple[BenchMethod, int]]:
        """(method, K) pairs in run order: AR first (K = 0), then each method × K."""
        out: list[tuple[BenchMethod, int]] = []
        for m in parse_methods(self.methods, self.base):
            out.extend([(m, k) for k in self.ks] if m.uses_k else [(m, 0)])
        return out

    def to_dict(self) -> dict:
        return {"methods": self.methods, "ks": self.ks, "temperatures": self.temperatures,
                "max_new_tokens": self.max_new_tokens, "repeats": self.repeats, "seed": self.seed,
                "concurrency": self.concurrency,
                "concurrency_repeats": self.concurrency_repeats, "ignore_eos": self.ignore_eos,
                "prefix_cache_tokens": self.prefix_cache_tokens,
                "base_spec": asdict(self.base),
                "contamination": {**self.trust.to_dict(), "observed": self.observed.to_dict()}}


@dataclass(frozen=True)
class Arm:
    """One timed configuration: `method` at draft length `k` run on `llm`. `meta` is
    merged into each of its records (a variant sweep names the draft there). `scope`
    keeps what the arm's requests leave behind (suffix cache, prompt KV copies) its own:
    AR and a method run the same prompt back to back, and neither may find the other's."""

    method: BenchMethod
    k: int
    llm: LLM
    meta: dict = field(default_factory=dict)
    scope: str | None = None

    def spec(self) -> SpecConfig:
        return dataclasses.replace(self.method.spec(self.k), cache_scope=self.scope)


def make_arms(cfg: BenchConfig, llm: LLM, drafts: dict[str, tuple[LLM, dict]] | None = None) -> list[Arm]:
    """cfg.configs() on `llm`; with `drafts` ({name: (LLM holding that draft, record meta)})
    every config of a method that needs a draft runs once per draft, on that draft's LLM."""
    arms: list[Arm] = []
    for method, k in cfg.configs():
        if method.needs_draft and drafts:
            arms.extend(Arm(method, k, d_llm, meta) for d_llm, meta in drafts.values())
        else:
            arms.append(Arm(method, k, llm))
    return [dataclasses.replace(arm, scope=f"bench-arm{i}") for i, arm in enumerate(arms)]


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


def busy_warning(load1: float, cores: int) -> str | None:
    """A loud warning when the 1-minute load exceeds half the cores, else None."""
    if load1 > cores * 0.5:
        return (f"MACHINE BUSY: load average {load1:.2f} on {cores} cores (> {cores * 0.5:.1f}) at start; "
                f"llama.cpp threads wait for each other, so timings are unreliable: rerun on a quiet machine")
    return None


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
    if wait["max_wait_s"] > 0 and wait["quiet"]:
        # busy at start (often this bench's own model loading, or a run just stopped), quiet before timing
        warnings = [w for w in warnings if not w.startswith("MACHINE BUSY")]
    if wait["max_wait_s"] > 0 and not wait["quiet"]:
        warnings.append(f"MACHINE NEVER QUIET: load average {wait['loads'][-1][1]:.2f} >= {wait['threshold']:.2f} "
                        f"after waiting {wait['waited_s']:g} s (--wait-quiet); timings may be noisy")
    threads = [expected_threads(a) for a in arms]
    replay = [learns_across_requests(a) for a in arms]
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
        rec, result = timed(arms[slot.arm_index], ids, params, slot.head, threads[slot.arm_index], policy, cores)
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
                        rec, result = timed(arm, ids, params, head, threads[ai], policy, cores)
                        unit.slots.append(Slot(ai, arm.method.name == BASELINE, not replay[ai], [(rec, result)], head))
                    queue.add(unit)
    queue.finish()
    left = sum(1 for r in records if r.get("starved"))
    if left:
        warnings.append(f"{left} request{'s' if left > 1 else ''} still starved of CPU after re-runs "
                        "(see report.md, Contamination): their ratios are unreliable; rerun on a quiet machine")
    conc = run_concurrency(prompts, encoded, cfg, arms, on_concurrency, meta, sink) if cfg.concurrency else []
    if any(c["starved"] for c in conc):
        warnings.append(f"{sum(1 for c in conc if c['starved'])} concurrency rows starved of CPU (not re-run): "
                        "their throughput is unreliable")
    load_after = os.getloadavg()
    peak = max([load_after[0], *(r["load1"] for r in records)])
    own = max((t for t in threads if t), default=0)  # the load this bench's own llama.cpp threads make
    if not any("BUSY" in w for w in warnings) and peak > own + cores * 0.5:
        warnings.append(f"MACHINE BUSY DURING THE RUN: load average reached {peak:.2f} on {cores} cores, more "
                        f"than this bench's own {own} threads explain (quiet at start); per-request load is in "
                        f"requests.jsonl (load1): rerun on a quiet machine")
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
    t0, c0 = time.perf_counter(), contamination.cpu_clock()

    def client(i: int) -> GenerationResult:
        submitted[i] = (time.perf_counter() - t0) * 1000
        return engine.submit(jobs[i][0], jobs[i][1], spec).result()
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(client, range(len(jobs))))
    finally:
        engine.shutdown()
    wall_ms = (time.perf_counter() - t0) * 1000
    cpu_s, threads = contamination.cpu_clock() - c0, expected_threads(arm)
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
