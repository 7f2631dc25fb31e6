"""The plan stage: what one bench run will do, decided and checked before any model loads.

A `BenchPlan` holds the prompts, the sweep (`BenchConfig`), the models and how
to load them, and what the run adds beside the requests: whether it measures
the models' quality, and the methods the copy ceiling is set beside. The models are names
(`ModelNames`: `speclm bench`, each target loaded in turn) or an `LLM` already
built (tests, notebooks: its target and draft are the run's models and stay
open). Either way the run then goes through the same stages
(bench/pipeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...api import LLM
from ...backends.base import N_CTX
from ...costs import TIMED_K
from ...errors import InvalidRequestError
from ...models.catalog import canonical_name, resolve_model
from ...models.registry import DEFAULT_TARGET, default_draft
from ...speculative.methods import METHODS as TABLE
from .config import BenchConfig
from .texts import text_set
from .workloads import Prompt


@dataclass
class ModelNames:
    """The models of a run by name, resolved (they exist) but not loaded, and how to load them.
    speculator: the SSD speculator's settings; kernels: as `LLM(kernels=...)`."""

    targets: list[str]
    drafts: list[str]  # empty when no method uses a draft
    n_ctx: int = N_CTX
    threads: int | None = None
    kernels: str | None = None
    speculator: object | None = None


def plan_models(target: str | None, targets: list[str] | None, draft: str | None, drafts: list[str] | None,
                needs_draft: bool, **load) -> ModelNames:
    """Targets and drafts from --target/--targets and --draft/--drafts; every name is
    resolved here (an unknown name or unprepared NAME@QUANT fails before any model loads)
    and kept as it is recorded (catalog.canonical_name). `load`: ModelNames' loading settings."""
    if target and targets:
        raise InvalidRequestError("give --target NAME or --targets A,B,..., not both")
    if draft and drafts:
        raise InvalidRequestError("give --draft NAME or --drafts X,Y,..., not both")
    if drafts and not needs_draft:
        raise InvalidRequestError("--drafts given but no method in --methods uses a draft: add sd-draft "
                                  "(or auto, heuristic) to --methods")
    tlist = list(dict.fromkeys(targets or [target or DEFAULT_TARGET]))
    dlist = list(dict.fromkeys(drafts or ([draft] if draft else []))) if needs_draft else []
    if needs_draft and not dlist:
        if any(default_draft(t) is None for t in tlist):
            raise InvalidRequestError("method sd-draft needs a draft model: pass --draft NAME|PATH "
                                      "(or --drafts X,Y) or drop sd-draft from --methods")
        dlist = [default_draft(tlist[0])]
    for name in tlist + dlist:
        resolve_model(name)
    return ModelNames(list(dict.fromkeys(map(canonical_name, tlist))), list(dict.fromkeys(map(canonical_name, dlist))),
                      **load)


def suffix_configs(cfg: BenchConfig) -> tuple[list[str], int]:
    """(the run's methods that draft by suffix, their largest K) — ([], 0) when none runs greedy."""
    if 0 not in [float(t) for t in cfg.temperatures]:
        return [], 0
    found = [(m.name, k) for m, k in cfg.configs()
             if TABLE[m.method].proposal_for(m.spec(k), has_draft=True) == "suffix"]
    return list(dict.fromkeys(n for n, _ in found)), min(TIMED_K, max((k for _, k in found), default=0))


@dataclass
class BenchPlan:
    """One bench run, planned. `variant_quality`: also the perplexity of every model and
    greedy agreement with the first target; `texts`: the text set models by name are
    scored and timed on (setup/texts.py; none for an LLM given); `ceiling_methods` and
    `ceiling_k`: the copy ceiling's methods and largest K (none: no ceiling)."""

    prompts: list[Prompt]
    cfg: BenchConfig
    models: ModelNames | LLM
    dataset: str | None = None
    variant_quality: bool = False
    ceiling_methods: list[str] = field(default_factory=list)
    ceiling_k: int = 0
    texts: list[tuple[str, str]] = field(default_factory=list)  # (label, text)

    @property
    def target_count(self) -> int:
        return len(self.models.targets) if isinstance(self.models, ModelNames) else 1

    @property
    def draft_count(self) -> int:
        if isinstance(self.models, ModelNames):
            return len(self.models.drafts)
        return int(self.cfg.uses_draft())  # the LLM's own draft (loaded when a method needs it)

    @property
    def max_sequences(self) -> int:
        """KV sequences a loaded model needs: 2, or a concurrency row's N (trust/phases.py)."""
        return max([2, *(min(n, len(self.prompts)) for n in self.cfg.concurrency)])

    def planned(self) -> tuple[int, int]:
        """(timed requests, concurrency rows) of the whole run, every target together."""
        arms = self.cfg.arm_count(self.draft_count)
        return (self.target_count * self.cfg.planned_requests(len(self.prompts), arms),
                self.target_count * self.cfg.planned_rows(arms))


def plan_bench(prompts: list[Prompt], cfg: BenchConfig, models: ModelNames | LLM, *, dataset: str | None = None,
               variant_quality: bool = False) -> BenchPlan:
    """The plan of a run over `models`: names (loaded in turn) or an LLM already built.
    variant_quality: models by name only, whose context must fit the text set."""
    if not prompts:
        raise InvalidRequestError("no prompts to benchmark: check --categories / --dataset")
    if variant_quality and not isinstance(models, ModelNames):
        raise InvalidRequestError("--variant-quality needs the models by name")
    methods, k = suffix_configs(cfg)
    texts = text_set(variant_quality, models.n_ctx) if isinstance(models, ModelNames) else []
    return BenchPlan(list(prompts), cfg, models, dataset, variant_quality, methods, k, texts)
