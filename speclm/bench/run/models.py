"""The run stage's models: each target's turn (`Turn`) with the LLMs its arms run on, and
each model's line for the variants section (analysis/quality.model_line: file, size,
sha256, quality, v(b)).

Models by name: the drafts load first and stay loaded for the whole run; each
target then loads in turn, gets one LLM per draft over the same loaded target,
and is closed after its turn. Each is passed over the plan's text set at load
(setup/texts.py; tokens only without --variant-quality). An LLM already built is
one turn, on its own target and draft, and nothing is closed. A target's line is
written after its requests (the model is warm: v(b) is timed then, on the text
set's tokens or on the run's prompts where there is none), and its drafts' lines
after the first target's, when their agreement with it can be computed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...api import LLM
from ...backends.base import Backend
from ...backends.load import load_backend
from ..analysis import quality
from ..setup.plan import BenchPlan, ModelNames
from .manifest import describe_model


@dataclass
class Turn:
    """One target's part of the run: its describe_model dict, its LLM, the LLMs of its drafts
    ({name: (LLM, record meta)}), the meta every record gets, its quality pass (None
    without a text set) and its drafts' ({name: (describe_model dict, quality pass)})."""

    described: dict
    llm: LLM
    drafts: dict[str, tuple[LLM, dict]]
    meta: dict
    quality: quality.Quality | None
    draft_facts: dict[str, tuple[dict, quality.Quality | None]]


@dataclass
class Models:
    """What the run stage learns of its models: describe_model dicts for the manifest
    (`described_targets`, `described_drafts`), the variants section's lines (`targets` in
    run order, `drafts` by name), the first target's quality pass (every agreement is
    with it) and the threads llama.cpp computes with."""

    described_targets: list[dict] = field(default_factory=list)
    described_drafts: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    drafts: dict[str, dict] = field(default_factory=dict)
    reference: quality.Quality | None = None
    threads: int | None = None


@dataclass
class Loaded:
    """A model loaded by name: its backend, describe_model dict and quality pass over the
    plan's text set (tokens only, without --variant-quality)."""

    backend: Backend
    described: dict
    quality: quality.Quality


def load(name: str, names: ModelNames, plan: BenchPlan, work: str) -> Loaded:
    """`name` loaded for the run (`work`: what its kernels are chosen for, load_backend),
    described and passed over the plan's text set; closed again if that fails."""
    be = load_backend(name, names.n_ctx, names.threads, plan.max_sequences, names.kernels, work)
    try:
        return Loaded(be, describe_model(name, be) or {},
                      quality.measure_quality(be, plan.texts, run=plan.variant_quality))
    except BaseException:
        be.close()
        raise


def _turns_by_name(plan: BenchPlan, names: ModelNames, models: Models) -> Iterator[Turn]:
    kv = plan.cfg.prefix_cache_tokens
    drafts: dict[str, Loaded] = {}
    try:
        for i, name in enumerate([*names.drafts, *names.targets]):  # the drafts first: they stay loaded
            m = load(name, names, plan, "decoding" if i < len(names.drafts) else "speculation")
            if i < len(names.drafts):
                drafts[name] = m
                models.described_drafts.append(m.described)
                continue
            try:
                models.threads = models.threads or names.threads or m.backend.n_threads
                models.described_targets.append(m.described)
                llm = LLM(target=m.backend, prefix_cache_tokens=kv, kernels=names.kernels)  # wraps the loaded backends
                d_llms = {n: (LLM(target=m.backend, draft=d.backend, speculator=names.speculator,
                                  prefix_cache_tokens=kv, kernels=names.kernels),
                              {"draft_name": n, "draft_sha256": d.described.get("sha256")})
                          for n, d in drafts.items()}
                try:
                    yield Turn(m.described, llm, d_llms,
                               {"target_name": name, "target_sha256": m.described.get("sha256")}, m.quality,
                               {n: (d.described, d.quality) for n, d in drafts.items()})
                finally:
                    for d_llm, _ in d_llms.values():
                        d_llm.close_speculator()  # ssd: its process holds a draft copy; the next target starts anew
            finally:
                m.backend.close()
    finally:
        for d in drafts.values():
            d.backend.close()


def _turn_given(plan: BenchPlan, llm: LLM, models: Models) -> Iterator[Turn]:
    target = describe_model(None, llm.target) or {}
    models.described_targets.append(target)
    models.threads = getattr(llm.target, "n_threads", None)
    draft = (describe_model(None, llm.draft) or {}) if plan.draft_count else None
    models.described_drafts += [draft] if draft else []
    drafts = {draft["name"]: (llm, {"draft_name": draft["name"], "draft_sha256": draft.get("sha256")})} if draft else {}
    yield Turn(target, llm, drafts, {"target_name": target["name"], "target_sha256": target.get("sha256")},
               None, {draft["name"]: (draft, None)} if draft else {})


@contextmanager
def turns(plan: BenchPlan) -> Iterator[tuple[Iterator[Turn], Models]]:
    """(each target's turn, in run order; what they taught of the models). Models by name
    are closed when the block ends, however it ends."""
    models = Models()
    by_name = isinstance(plan.models, ModelNames)
    it = _turns_by_name(plan, plan.models, models) if by_name else _turn_given(plan, plan.models, models)
    try:
        yield it, models
    finally:
        it.close()


def finish_turn(turn: Turn, models: Models, prompt_ids: Sequence[Sequence[int]]) -> None:
    """After a target's requests, while it is warm: its line in the variants section and,
    after the first target's, its drafts' (agreement with the first target's pass; v(b)
    timed on their text-set tokens, or the run's prompts where there are none)."""
    first = not models.targets
    models.reference = models.reference or turn.quality
    lines: list[tuple[str | None, dict, quality.Quality | None, Backend]] = [
        (None, turn.described, turn.quality, turn.llm.target),
        *((name, *turn.draft_facts[name], d_llm.draft) for name, (d_llm, _) in turn.drafts.items() if first)]
    for name, described, q, backend in lines:
        ref = None if q is models.reference else models.reference  # None: q is the reference
        line = quality.model_line(described, q, ref, backend, q.tokens if q and q.tokens else prompt_ids)
        if name is None:
            models.targets.append(line)
        else:
            models.drafts[name] = line
