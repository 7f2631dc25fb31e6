"""What a bench run sweeps (`BenchConfig`) and the timed configurations it expands to (`Arm`)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

from ...api import LLM, SpecConfig
from ...errors import InvalidRequestError
from ...options import SWEPT, described, option
from ...prefix_cache import PREFIX_CACHE_HELP, PREFIX_CACHE_TOKENS, PrefixCache
from ...sampling import SamplingParams
from ..trust.policy import TrustLog, TrustPolicy
from .methods import BENCH_DEFAULT, TABLE, BenchMethod, bench_methods, parse_methods


@dataclass
class BenchConfig:
    """What to sweep. Every list is swept; AR runs once per (prompt, repeat, T, N).
    Each field is a declared setting: `speclm bench`'s flags are generated from it."""

    methods: list[str] = option(None, f"methods run against AR (which always runs), comma-separated, from "
                                f"{', '.join(bench_methods())}", many="csv",
                                default_factory=lambda: list(BENCH_DEFAULT))
    ks: list[int] = option(None, described(SpecConfig, "k", SWEPT), flag="--k", kind=int, many="csv",
                           default_factory=lambda: [2, 4, 8])
    temperatures: list[float] = option(None, described(SamplingParams, "temperature", SWEPT), flag="--temperature",
                                       kind=float, many="csv", default_factory=lambda: [0.0])
    max_new_tokens: list[int] = option(None, described(SamplingParams, "max_new_tokens", SWEPT), kind=int,
                                       many="csv", default_factory=lambda: [128])
    repeats: int = option(1, "repeats of the whole sweep")
    seed: int = option(0, described(SamplingParams, "seed", "; request i of a phase adds i"))
    concurrency: list[int] = option(None, "also measure throughput with N requests in flight, e.g. 1,2,4",
                                    kind=int, many="csv", default_factory=list)
    concurrency_repeats: int = option(1, "run every concurrency row R times, AR and the methods alternating who "
                                      "goes first; the report gives each ratio's range over the repeats",
                                      metavar="R")
    ignore_eos: bool = option(False, described(SamplingParams, "ignore_eos"))
    prefix_cache_tokens: int = option(PREFIX_CACHE_TOKENS, PREFIX_CACHE_HELP, metavar="N")  # each arm its own
    base: SpecConfig = field(default_factory=SpecConfig)  # the settings no sweep dimension sets
    trust: TrustPolicy = field(default_factory=TrustPolicy)  # contamination check and quiet wait
    observed: TrustLog = field(default_factory=TrustLog, compare=False)  # what they saw (all runs of it)

    def __post_init__(self) -> None:
        """Everything a run needs checked before any model loads."""
        for name in ("repeats", "concurrency_repeats"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if any(n < 1 for n in self.concurrency):
            raise InvalidRequestError(f"--concurrency values must be >= 1, got {self.concurrency}")
        PrefixCache(self.prefix_cache_tokens)
        for method, k in self.configs():
            method.spec(k)
        for t in self.temperatures:
            for n in self.max_new_tokens:
                SamplingParams(temperature=t, max_new_tokens=n, seed=self.seed)

    def unused_settings(self) -> list[str]:
        """The flags of base settings that no method of the sweep reads (the command warns
        once: the base serves every method, so no one method refuses them)."""
        unused: dict[str, str] | None = None
        for method, k in self.configs():
            spec = method.spec(k)
            here = {o.dest: o.flag for o in spec.unused_settings(TABLE[method.method].proposal_for(spec, True))}
            unused = here if unused is None else {d: f for d, f in unused.items() if d in here}
        return sorted((unused or {}).values())

    def configs(self) -> list[tuple[BenchMethod, int]]:
        """(method, K) pairs in run order: AR first (K = 0), then each method × K."""
        out: list[tuple[BenchMethod, int]] = []
        for m in parse_methods(self.methods, self.base):
            out.extend([(m, k) for k in self.ks] if m.uses_k else [(m, 0)])
        return out

    def uses_draft(self) -> bool:
        return any(m.needs_draft for m in parse_methods(self.methods, self.base))

    def arm_count(self, drafts: int) -> int:
        """Arms per target (make_arms): a config of a method that needs a draft runs once per draft."""
        return sum(max(1, drafts) if m.needs_draft else 1 for m, _ in self.configs())

    def planned_requests(self, prompts: int, arms: int) -> int:
        """Timed requests of one sweep over `prompts` prompts on `arms` arms (re-runs not counted)."""
        return prompts * self.repeats * len(self.temperatures) * len(self.max_new_tokens) * arms

    def planned_rows(self, arms: int) -> int:
        """Concurrency rows of one sweep on `arms` arms."""
        return len(self.temperatures) * len(self.concurrency) * self.concurrency_repeats * arms

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
