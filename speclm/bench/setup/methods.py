"""Bench methods: the method table (speclm.speculative.methods) seen by the bench.

Every table method is a bench method of the same name; an adaptive method is
also listed once per other proposal it can draft with, as NAME-PROPOSAL
(`auto-ngram`: auto over prompt lookup). Every method is also listed as
NAME+schema: the same method constrained by the prompt's grammar (extract's
schema, tool-call's call format; docs/design.md#structured-outputs), so
`ar+schema` is constrained plain decoding, the baseline of the +schema rows. `uses_k=False` methods (plain
decoding) run once per prompt, not once per K. The settings a method does not
sweep (SSD fan-out, n-gram sizes, ...) come from one base SpecConfig: the
command line's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ...api import LLM, SpecConfig
from ...constraints import Grammar
from ...errors import InvalidRequestError
from ...metrics import GenerationResult
from ...sampling import SamplingParams
from ...speculative.methods import METHODS as TABLE
from ...speculative.methods import PROPOSALS

BASELINE = "ar"
SCHEMA_BASELINE = "ar+schema"  # constrained plain decoding: the baseline of the NAME+schema methods
BENCH_DEFAULT = tuple(m.name for m in TABLE.values() if m.in_default_bench)  # the methods a bench runs by default


@dataclass(frozen=True)
class BenchMethod:
    """A table method with its proposal pinned. `spec(k)` is the SpecConfig for draft
    length k (k is ignored for methods with uses_k=False)."""

    name: str
    method: str
    proposal: str | None = None  # the PROPOSALS key it drafts with (None: the method's own)
    base: SpecConfig = dataclasses.field(default_factory=lambda: SpecConfig(method=BASELINE))
    predicted: bool = False  # drafts from the prompt's prediction too (NAME+prediction)
    constrained: bool = False  # the answer is constrained by the prompt's grammar (NAME+schema)

    @property
    def description(self) -> str:
        text = TABLE[self.method].description
        text = f"{text}; drafts with {self.proposal}" if self.proposal else text
        text = f"{text}; given the prompt's prediction (Predicted Outputs)" if self.predicted else text
        return f"{text}; constrained by the prompt's grammar" if self.constrained else text

    @property
    def baseline(self) -> str:
        """The bench method this one's ratios and greedy identity are against."""
        return baseline_of(self.name)

    @property
    def uses_k(self) -> bool:
        return TABLE[self.method].uses_k

    @property
    def needs_draft(self) -> bool:
        return TABLE[self.method].needs_draft(self.spec(1), has_draft=True)

    def spec(self, k: int) -> SpecConfig:
        return dataclasses.replace(self.base, method=self.method, proposal=self.proposal,
                                   k=k if self.uses_k else self.base.k, shared=True)

    def generate(self, llm: LLM, prompt_ids: list[int], params: SamplingParams,
                 spec: SpecConfig, prediction: str | None = None, grammar: Grammar | None = None) -> GenerationResult:
        """One request with this method (the timed call of run/records.timed); a
        predicted method is given the prompt's prediction, the others never; a
        constrained one the prompt's grammar (and no ignore_eos: the grammar ends the answer)."""
        if self.constrained and grammar is not None:
            params = dataclasses.replace(params, grammar=grammar, ignore_eos=False)
        return llm.generate(prompt_ids, params, spec, prediction=prediction if self.predicted else None)


def baseline_of(method: str) -> str:
    """The method a bench method's ratios and greedy identity are against (by name)."""
    return SCHEMA_BASELINE if method.endswith("+schema") and method != SCHEMA_BASELINE else BASELINE


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
        kind = bm.proposal or TABLE[bm.method].proposal
        if kind is not None and PROPOSALS[kind].predicts:
            out[f"{name}+prediction"] = dataclasses.replace(bm, name=f"{name}+prediction", predicted=True)
    for name, bm in list(out.items()):  # NAME+schema: the same method under the prompt's grammar
        out[f"{name}+schema"] = dataclasses.replace(bm, name=f"{name}+schema", constrained=True)
    return out


def bench_method(name: str, base: SpecConfig | None = None) -> BenchMethod:
    """The bench method `name`; InvalidRequestError listing known names otherwise."""
    known = bench_methods(base)
    try:
        return known[name]
    except KeyError:
        raise InvalidRequestError(f"unknown bench method {name!r}; known: {', '.join(known)}") from None


def parse_methods(names: Sequence[str], base: SpecConfig | None = None) -> list[BenchMethod]:
    """Methods in the order given, duplicates dropped, the AR baseline always first (and
    constrained AR second when a +schema method is asked for: their baseline)."""
    seen = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    methods = [bench_method(n, base) for n in seen]
    if any(m.constrained for m in methods) and SCHEMA_BASELINE not in seen:
        methods.insert(0, bench_method(SCHEMA_BASELINE, base))
    if BASELINE not in seen:
        methods.insert(0, bench_method(BASELINE, base))
    return sorted(methods, key=lambda m: (m.name != BASELINE, m.name != SCHEMA_BASELINE))
