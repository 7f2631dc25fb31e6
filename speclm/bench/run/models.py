"""The run stage's models: each target's turn (`Turn`) with the LLMs its arms run on, and
each model's line for the variants section (file, size, sha256, quality, v(b)).

Models by name: the drafts load first and stay loaded for the whole run; each
target then loads in turn, gets one LLM per draft over the same loaded target,
and is closed after its turn. They are tokenized on the quality text set
(analysis/quality.py: the sections of ppl_text.txt; with --variant-quality also
QUALITY_TEXTS HumanEval problems, scored for perplexity and agreement). An LLM
already built is one turn, on its own target and draft, and nothing is closed.
v(b) is timed after the target's requests (the model is warm;
speclm.costs.time_blocks, median of V_REPEATS) on the text set, or on the run's
prompts where there is none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...api import LLM
from ...backends.base import Backend
from ...backends.load import load_backend
from ...costs import time_blocks
from ...errors import InvalidRequestError
from ..analysis import quality
from ..analysis.pair_ranking import V_KS, V_REPEATS
from ..setup.plan import BenchPlan, ModelNames
from .manifest import describe_model

QUALITY_TEXTS = 8  # HumanEval problems added to the perplexity text set (as `speclm models compare`)


@dataclass
class Turn:
    """One target's part of the run: its describe_model dict, its LLM, the LLMs of its drafts
    ({name: (LLM, record meta)}), the meta every record gets, and its quality pass (None
    without a text set)."""

    described: dict
    llm: LLM
    drafts: dict[str, tuple[LLM, dict]]
    meta: dict
    quality: quality.Quality | None


@dataclass
class Models:
    """What the run stage learns of its models: the text set they were tokenized on,
    describe_model dicts for the manifest (`described_targets`, `described_drafts`), the
    variants section's lines (`targets` in run order, `drafts` by name) and the threads
    llama.cpp computes with."""

    texts: list[tuple[str, str]] = field(default_factory=list)  # the quality text set: (label, text)
    described_targets: list[dict] = field(default_factory=list)
    described_drafts: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    drafts: dict[str, dict] = field(default_factory=dict)
    threads: int | None = None


def model_entry(d: dict, q: quality.Quality | None) -> dict:
    """A model's line in the variants section, from its describe_model dict and quality pass."""
    return {"name": d["name"], "file": d.get("path"), "size": d.get("size"), "sha256": d.get("sha256"),
            "source": d.get("source"), "quant": d.get("quant"), "perplexity": q and q.perplexity,
            "ppl_tokens": q.ppl_tokens if q else 0, "agreement": q and q.agreement,
            "agreement_note": q.note if q else "quality pass skipped"}


def time_v(backend: Backend, tokens: Sequence[Sequence[int]]) -> dict:
    """v(b) at V_KS after quality.CONTEXT tokens of `tokens`, as the variants section keeps it."""
    context, block = quality.timing_block(tokens, max(V_KS))
    return quality.v_summary(time_blocks([backend], context, block, V_KS, V_REPEATS)[0])


def text_set(plan: BenchPlan, names: ModelNames) -> list[tuple[str, str]]:
    """The quality text set of a run on models by name, checked to fit their context."""
    if plan.variant_quality and names.n_ctx < quality.N_CTX:
        raise InvalidRequestError(f"--variant-quality scores texts of up to {quality.N_CTX} tokens: "
                                  f"raise --n-ctx to {quality.N_CTX} or more")
    return quality.load_texts(QUALITY_TEXTS if plan.variant_quality else 0)


@dataclass
class Loaded:
    """A model loaded by name: its backend, describe_model dict and quality pass over the
    text set (tokens only, without --variant-quality)."""

    backend: Backend
    described: dict
    quality: quality.Quality


def load(name: str, names: ModelNames, plan: BenchPlan, texts: list[tuple[str, str]],
         work: str | None = None) -> Loaded:
    """`name` loaded for the run (`work`: what its kernels are chosen for, load_backend),
    described and passed over `texts`; closed again if that fails."""
    be = load_backend(name, names.n_ctx, names.threads, plan.max_sequences, names.kernels, work)
    try:
        return Loaded(be, describe_model(name, be) or {},
                      quality.measure_quality(be, texts, run=plan.variant_quality))
    except BaseException:
        be.close()
        raise


def _turns_by_name(plan: BenchPlan, names: ModelNames, models: Models) -> Iterator[Turn]:
    texts, kv = models.texts, plan.cfg.prefix_cache_tokens
    drafts: dict[str, Loaded] = {}
    try:
        for name in names.drafts:
            d = drafts[name] = load(name, names, plan, texts, "decoding")
            models.described_drafts.append(d.described)
            models.drafts[name] = {**model_entry(d.described, d.quality), **time_v(d.backend, d.quality.tokens)}
        ref: quality.Quality | None = None  # the first target's pass: every agreement is with it
        for name in names.targets:
            t = load(name, names, plan, texts)
            try:
                models.threads = models.threads or names.threads or t.backend.n_threads
                q = quality.compared(t.quality, ref)
                if ref is None:
                    ref = q
                    for d_name, d in drafts.items():
                        models.drafts[d_name].update(model_entry(d.described, quality.compared(d.quality, ref)))
                models.described_targets.append(t.described)
                llm = LLM(target=t.backend, prefix_cache_tokens=kv, kernels=names.kernels)  # wraps the loaded backends
                d_llms = {n: (LLM(target=t.backend, draft=d.backend, speculator=names.speculator,
                                  prefix_cache_tokens=kv, kernels=names.kernels),
                              {"draft_name": n, "draft_sha256": models.drafts[n]["sha256"]})
                          for n, d in drafts.items()}
                try:
                    yield Turn(t.described, llm, d_llms,
                               {"target_name": name, "target_sha256": t.described.get("sha256")}, q)
                finally:
                    for d_llm, _ in d_llms.values():
                        d_llm.close_speculator()  # ssd: its process holds a draft copy; the next target starts anew
            finally:
                t.backend.close()
    finally:
        for d in drafts.values():
            d.backend.close()


def _turn_given(plan: BenchPlan, llm: LLM, models: Models) -> Iterator[Turn]:
    target = describe_model(None, llm.target) or {}
    models.described_targets.append(target)
    models.threads = getattr(llm.target, "n_threads", None)
    drafts: dict[str, tuple[LLM, dict]] = {}
    if plan.draft_count:
        draft = describe_model(None, llm.draft) or {}
        models.described_drafts.append(draft)
        models.drafts[draft["name"]] = model_entry(draft, None)
        drafts[draft["name"]] = llm, {"draft_name": draft["name"], "draft_sha256": draft.get("sha256")}
    yield Turn(target, llm, drafts, {"target_name": target["name"], "target_sha256": target.get("sha256")},
               None)


@contextmanager
def turns(plan: BenchPlan) -> Iterator[tuple[Iterator[Turn], Models]]:
    """(each target's turn, in run order; what they taught of the models). Models by name
    are closed when the block ends, however it ends."""
    by_name = isinstance(plan.models, ModelNames)
    models = Models(text_set(plan, plan.models) if by_name else [])
    it = _turns_by_name(plan, plan.models, models) if by_name else _turn_given(plan, plan.models, models)
    try:
        yield it, models
    finally:
        it.close()


def finish_turn(turn: Turn, models: Models, prompt_ids: Sequence[Sequence[int]]) -> None:
    """After a target's requests: its variants line, v(b) timed now that it is warm (on the
    text set's tokens, or the run's prompts where there is none), and its drafts' v(b)
    where they were not timed at load."""
    tokens = turn.quality.tokens if turn.quality and turn.quality.tokens else prompt_ids
    models.targets.append({**model_entry(turn.described, turn.quality),
                           **time_v(turn.llm.target, tokens)})
    for name, (d_llm, _) in turn.drafts.items():
        if "v_ms" not in models.drafts[name]:
            models.drafts[name].update(time_v(d_llm.draft, prompt_ids))
