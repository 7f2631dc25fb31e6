"""The benchmark sweep: methods × K × temperature × max_new_tokens × repeats.

Fairness: one process, one warm-up generation per method first, then per
repeat and per prompt the AR baseline runs first and every method config
right after it on the same prompt, so machine noise hits all alike. Every
request yields one record (see `request_record`) and its per-round trace;
a `TraceSink` streams both to JSONL as they are produced.

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

import json
import os
import resource
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
from ..sampling import SamplingParams
from ..speculative.identity import compare_greedy
from .methods import BASELINE, BENCH_DEFAULT, BenchMethod, parse_methods
from .report import acceptance_from_counts, distribution, round_counts
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
    ignore_eos: bool = False
    base: SpecConfig = field(default_factory=SpecConfig)  # the settings no sweep dimension sets

    def configs(self) -> list[tuple[BenchMethod, int]]:
        """(method, K) pairs in run order: AR first (K = 0), then each method × K."""
        out: list[tuple[BenchMethod, int]] = []
        for m in parse_methods(self.methods, self.base):
            out.extend([(m, k) for k in self.ks] if m.uses_k else [(m, 0)])
        return out

    def to_dict(self) -> dict:
        return {"methods": self.methods, "ks": self.ks, "temperatures": self.temperatures,
                "max_new_tokens": self.max_new_tokens, "repeats": self.repeats, "seed": self.seed,
                "concurrency": self.concurrency, "ignore_eos": self.ignore_eos,
                "base_spec": asdict(self.base)}


@dataclass(frozen=True)
class Arm:
    """One timed configuration: `method` at draft length `k` run on `llm`. `meta` is
    merged into each of its records (a variant sweep names the draft there)."""

    method: BenchMethod
    k: int
    llm: LLM
    meta: dict = field(default_factory=dict)


def make_arms(cfg: BenchConfig, llm: LLM, drafts: dict[str, tuple[LLM, dict]] | None = None) -> list[Arm]:
    """cfg.configs() on `llm`; with `drafts` ({name: (LLM holding that draft, record meta)})
    every config of a method that needs a draft runs once per draft, on that draft's LLM."""
    arms: list[Arm] = []
    for method, k in cfg.configs():
        if method.needs_draft and drafts:
            arms.extend(Arm(method, k, d_llm, meta) for d_llm, meta in drafts.values())
        else:
            arms.append(Arm(method, k, llm))
    return arms


@dataclass
class BenchRun:
    """Everything a sweep measured, ready for report.build_summary."""

    requests: list[dict]
    concurrency: list[dict]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    started: float  # epoch seconds
    ended: float
    warnings: list[str]


class TraceSink:
    """Streams per-round lines to rounds.jsonl and per-request lines to requests.jsonl."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self._rounds: IO[str] = open(out_dir / "rounds.jsonl", "w", encoding="utf-8")
        self._requests: IO[str] = open(out_dir / "requests.jsonl", "w", encoding="utf-8")

    def write(self, record: dict, result: GenerationResult) -> None:
        keys = ("request_id", "category", "method", "k", "temperature", "max_new_tokens",
                "prompt_index", "repeat", "target_name", "draft_name")
        head = {key: record[key] for key in keys if key in record}
        for i, r in enumerate(result.rounds):
            self._rounds.write(json.dumps({**head, "round": i, **r.to_dict()}) + "\n")
        self._requests.write(json.dumps(record) + "\n")
        self._rounds.flush()
        self._requests.flush()

    def close(self) -> None:
        self._rounds.close()
        self._requests.close()


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def busy_warning(load1: float, cores: int) -> str | None:
    """A loud warning when the 1-minute load exceeds half the cores, else None."""
    if load1 > cores * 0.5:
        return (f"MACHINE BUSY: load average {load1:.2f} on {cores} cores (> {cores * 0.5:.1f}) at start; "
                f"llama.cpp threads wait for each other, so timings are unreliable: rerun on a quiet machine")
    return None


def request_record(result: GenerationResult, meta: dict) -> dict:
    """One request's figures (design note §2 names) merged into `meta`."""
    s = result.summary
    counts = round_counts(result.rounds)
    acc = acceptance_from_counts(counts)
    wall = s.wall_ms
    return {**meta, "prompt_tokens": result.prompt_tokens, "output_tokens": s.output_tokens,
            "finish_reason": result.finish_reason, "wall_ms": wall, "ttft_ms": s.ttft_ms,
            "tpot_ms": s.tpot_ms, "tokens_per_s": s.tokens_per_s,
            "accepted_progress_per_ms": s.accepted_progress_per_ms, **counts, **acc,
            "prefill_ms": s.prefill_ms, "draft_ms": s.draft_ms, "verify_ms": s.verify_ms,
            "other_ms": s.other_ms,
            # the first round's drafting includes the draft model's own prompt prefill
            "first_round_draft_ms": result.rounds[0].draft_ms if result.rounds else 0.0,
            "first_round_proposed": result.rounds[0].proposed if result.rounds else 0,
            "draft_share": s.draft_ms / wall if wall > 0 else 0.0,
            "verify_share": s.verify_ms / wall if wall > 0 else 0.0,
            "peak_rss_mb": peak_rss_mb(), "load1": os.getloadavg()[0],
            "target": result.target, "draft": result.draft, "text": result.text,
            "token_ids": result.token_ids, **ssd_counts(result.rounds)}


def ssd_counts(rounds) -> dict:
    """SSD rounds only: cache hits overall and by the outcome k they answered, and the
    verifier's wait for blocks ({} when no round went through a speculator)."""
    ssd = [r.info for r in rounds if r.info and "hit" in r.info]
    if not ssd:
        return {}
    by_k: dict[str, list[int]] = {}
    for info in ssd:
        if "outcome_k" in info:
            h_n = by_k.setdefault(str(info["outcome_k"]), [0, 0])
            h_n[0] += bool(info["hit"])
            h_n[1] += 1
    return {"cache_rounds": len(ssd), "cache_hits": sum(bool(i["hit"]) for i in ssd), "cache_hits_by_k": by_k,
            "speculator_wait_ms": sum(i.get("wait_ms", 0.0) for i in ssd),
            "speculator_wait_hit_ms": sum(i.get("wait_ms", 0.0) for i in ssd if i["hit"]),
            "speculator_busy_ms": sum(i.get("busy_ms", 0.0) for i in ssd)}


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
    """Run the sweep. `on_request` sees each record (progress bars). `arms` (default
    make_arms(cfg, llm)) all share `llm`'s target; `meta` is merged into every record
    and request ids count on from `first_id` (a variant sweep calls this per target)."""
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
    records: list[dict] = []
    n = first_id
    for rep in range(cfg.repeats):
        for pi, (prompt, ids) in enumerate(zip(prompts, encoded)):
            for temp in cfg.temperatures:
                for max_new in cfg.max_new_tokens:
                    seed = cfg.seed + 100_003 * rep + pi
                    params = _params(cfg, temp, max_new, seed)
                    ar_ids: list[int] | None = None
                    for arm in arms:
                        method, k = arm.method, arm.k
                        result = method.generate(arm.llm, ids, params, method.spec(k))
                        n += 1
                        head = {"request_id": f"r{n:05d}", "category": prompt.category,
                                "prompt_index": prompt.index, "repeat": rep, "method": method.name,
                                "k": k, "temperature": temp, "max_new_tokens": max_new,
                                "seed": seed, "chat": prompt.chat, **(meta or {}), **arm.meta}
                        rec = request_record(result, head)
                        if method.name == BASELINE:
                            ar_ids = result.token_ids
                        rec["identity"] = None
                        if params.greedy and method.name != BASELINE and ar_ids is not None:
                            rec["identity"] = compare_greedy(llm.target, ids, ar_ids, result.token_ids).to_dict()
                        records.append(rec)
                        if sink:
                            sink.write(rec, result)
                        if on_request:
                            on_request(rec)
    conc = run_concurrency(prompts, encoded, cfg, arms, on_concurrency, meta) if cfg.concurrency else []
    load_after = os.getloadavg()
    peak = max([load_after[0], *(r["load1"] for r in records)])
    if not warnings and peak > cores * 0.5:
        warnings.append(f"MACHINE BUSY DURING THE RUN: load average reached {peak:.2f} on {cores} cores "
                        f"(quiet at start); per-request load is in requests.jsonl (load1): rerun on a quiet machine")
    return BenchRun(records, conc, load_before, load_after, started, time.time(), warnings)


def run_concurrency(prompts: Sequence[Prompt], encoded: list[list[int]], cfg: BenchConfig, arms: list[Arm],
                    on_row: Callable[[dict], None] | None = None, meta: dict | None = None) -> list[dict]:
    """For each N, T and method config: every prompt once, N in flight; throughput and
    latency/TTFT distributions (latency = submit → last token)."""
    rows: list[dict] = []
    max_new = cfg.max_new_tokens[0]
    for temp in cfg.temperatures:
        for n in cfg.concurrency:
            for arm in arms:
                method, k = arm.method, arm.k
                spec = method.spec(k)
                engine = Engine(arm.llm, max_concurrency=n, max_queue=len(encoded) + n)
                jobs = [(ids, _params(cfg, temp, max_new, cfg.seed + i)) for i, ids in enumerate(encoded)]
                t0 = time.perf_counter()
                try:
                    with ThreadPoolExecutor(max_workers=n) as pool:
                        results = list(pool.map(lambda j: engine.submit(j[0], j[1], spec).result(), jobs))
                finally:
                    engine.shutdown()
                wall_ms = (time.perf_counter() - t0) * 1000
                tokens = sum(r.summary.output_tokens for r in results)
                row = {"concurrency": n, "method": method.name, "k": k, "temperature": temp,
                       "max_new_tokens": max_new, "requests": len(results), "output_tokens": tokens,
                       "wall_ms": wall_ms, "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
                       "latency_ms": distribution([r.summary.wall_ms for r in results]),
                       "ttft_ms": distribution([r.summary.ttft_ms for r in results if r.summary.ttft_ms is not None]),
                       "peak_rss_mb": peak_rss_mb(), "target": results[0].target, "draft": results[0].draft,
                       **(meta or {}), **arm.meta}
                rows.append(row)
                if on_row:
                    on_row(row)
    return rows
