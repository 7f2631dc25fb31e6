"""What a bench run sweeps (`BenchConfig`) and the timed configurations it expands to (`Arm`)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from ...api import LLM, SpecConfig
from ...prefix_cache import PREFIX_CACHE_TOKENS
from ..trust.policy import TrustLog, TrustPolicy
from .methods import BENCH_DEFAULT, BenchMethod, parse_methods


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

    def uses_draft(self) -> bool:
        return any(m.needs_draft for m in parse_methods(self.methods, self.base))

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
    merged into each of its records (a variant sweep names the draft there)."""

    method: BenchMethod
    k: int
    llm: LLM
    meta: dict = field(default_factory=dict)

    def spec(self, scope: str | None = None) -> SpecConfig:
        """Its SpecConfig, its requests' caches (suffix cache, prompt KV copies) kept in
        `scope`: AR and a method run the same prompt back to back, and neither may find
        the other's (trust/phases.py names a scope per arm and phase)."""
        return dataclasses.replace(self.method.spec(self.k), cache_scope=scope)


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
