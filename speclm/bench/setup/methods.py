"""Bench methods: the method table (speclm.speculative.methods) seen by the bench.

Every table method is a bench method of the same name; an adaptive method is
also listed once per other proposal it can draft with, as NAME-PROPOSAL
(`auto-ngram`: auto over prompt lookup). `uses_k=False` methods (plain
decoding) run once per prompt, not once per K. The settings a method does not
sweep (SSD fan-out, n-gram sizes, ...) come from one base SpecConfig: the
command line's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ...api import LLM, SpecConfig
from ...errors import InvalidRequestError
from ...metrics import GenerationResult
from ...sampling import SamplingParams
from ...speculative.methods import METHODS as TABLE
from ...speculative.methods import PROPOSALS

BASELINE = "ar"
BENCH_DEFAULT = tuple(m.name for m in TABLE.values() if m.in_default_bench)  # the methods a bench runs by default


@dataclass(frozen=True)
class BenchMethod:
    """A table method with its proposal pinned. `spec(k)` is the SpecConfig for draft
    length k (k is ignored for methods with uses_k=False)."""

    name: str
    method: str
    proposer: str | None = None
    base: SpecConfig = dataclasses.field(default_factory=lambda: SpecConfig(method=BASELINE))
    predicted: bool = False  # drafts from the prompt's prediction too (NAME+prediction)

    @property
    def description(self) -> str:
        text = TABLE[self.method].description
        text = f"{text}; drafts with {self.proposer}" if self.proposer else text
        return f"{text}; given the prompt's prediction (Predicted Outputs)" if self.predicted else text

    @property
    def uses_k(self) -> bool:
        return TABLE[self.method].uses_k

    @property
    def needs_draft(self) -> bool:
        return TABLE[self.method].needs_draft(self.spec(1), has_draft=True)

    def spec(self, k: int) -> SpecConfig:
        return dataclasses.replace(self.base, method=self.method, proposer=self.proposer,
                                   k=k if self.uses_k else self.base.k, shared=True)

    def generate(self, llm: LLM, prompt_ids: list[int], params: SamplingParams,
                 spec: SpecConfig, prediction: str | None = None) -> GenerationResult:
        """One request with this method (the timed call of run/records.timed); a
        predicted method is given the prompt's prediction, the others never."""
        return llm.generate(prompt_ids, params, spec, prediction=prediction if self.predicted else None)


def bench_methods(base: SpecConfig | None = None) -> dict[str, BenchMethod]:
    """Every bench method, built from the method table now, with `base`'s other settings."""
    base = base or SpecConfig(method=BASELINE)
    out: dict[str, BenchMethod] = {}
    for m in TABLE.values():
        if not m.adaptive:
            out[m.name] = BenchMethod(m.name, m.name, None, base)
            continue
        out[m.name] = BenchMethod(m.name, m.name, m.proposal, base)
        for p in PROPOSALS.values():
            if p.selectable and p.name != m.proposal:
                out[f"{m.name}-{p.name}"] = BenchMethod(f"{m.name}-{p.name}", m.name, p.name, base)
    for name, bm in list(out.items()):  # NAME+prediction: the same method given the prompt's prediction
        kind = bm.proposer or TABLE[bm.method].proposal
        if kind is not None and PROPOSALS[kind].predicts:
            out[f"{name}+prediction"] = dataclasses.replace(bm, name=f"{name}+prediction", predicted=True)
    return out


def get_method(name: str, base: SpecConfig | None = None) -> BenchMethod:
    """The bench method `name`; InvalidRequestError listing known names otherwise."""
    known = bench_methods(base)
    try:
        return known[name]
    except KeyError:
        raise InvalidRequestError(f"unknown bench method {name!r}; known: {', '.join(known)}") from None


def parse_methods(names: Sequence[str], base: SpecConfig | None = None) -> list[BenchMethod]:
    """Methods in the order given, duplicates dropped, the AR baseline always first."""
    seen = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    methods = [get_method(n, base) for n in seen]
    if BASELINE not in seen:
        methods.insert(0, get_method(BASELINE, base))
    return sorted(methods, key=lambda m: m.name != BASELINE)
