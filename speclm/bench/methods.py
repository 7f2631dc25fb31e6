"""Benchmark methods by name: how each builds the SpecConfig it runs with.

Registering a method is one call:

    register_method("ssd", lambda k: SpecConfig(method="ssd", k=k), needs_draft=True)

`uses_k=False` methods (plain decoding) run once per prompt, not once per K.
A method that cannot run through `LLM.generate` / `Engine.submit` with a
SpecConfig may pass `run(llm, prompt_ids, params, spec) -> GenerationResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..api import LLM, SpecConfig
from ..errors import InvalidRequestError
from ..metrics import GenerationResult
from ..sampling import SamplingParams

RunFn = Callable[[LLM, list[int], SamplingParams, SpecConfig], GenerationResult]


@dataclass(frozen=True)
class BenchMethod:
    """One registered method. `build(k)` returns the SpecConfig for draft length k
    (k is 0 for methods with uses_k=False)."""

    name: str
    build: Callable[[int], SpecConfig]
    uses_k: bool = True
    needs_draft: bool = False
    description: str = ""
    run: RunFn | None = None

    def spec(self, k: int) -> SpecConfig:
        return self.build(k if self.uses_k else 0)

    def generate(self, llm: LLM, prompt_ids: list[int], params: SamplingParams,
                 spec: SpecConfig) -> GenerationResult:
        """One request with this method (the timed call of the runner)."""
        if self.run is not None:
            return self.run(llm, prompt_ids, params, spec)
        return llm.generate(prompt_ids, params, spec)


METHODS: dict[str, BenchMethod] = {}
BASELINE = "ar"


def register_method(name: str, build: Callable[[int], SpecConfig], *, uses_k: bool = True,
                    needs_draft: bool = False, description: str = "",
                    run: RunFn | None = None) -> BenchMethod:
    """Add (or replace) a method; returns it."""
    method = BenchMethod(name, build, uses_k, needs_draft, description, run)
    METHODS[name] = method
    return method


def get_method(name: str) -> BenchMethod:
    """The registered method `name`; InvalidRequestError listing known names otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise InvalidRequestError(f"unknown bench method {name!r}; known: {', '.join(METHODS)}") from None


def parse_methods(names: Sequence[str]) -> list[BenchMethod]:
    """Methods in the order given, duplicates dropped, the AR baseline always first."""
    seen = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    methods = [get_method(n) for n in seen]
    if BASELINE not in seen:
        methods.insert(0, METHODS[BASELINE])
    return sorted(methods, key=lambda m: m.name != BASELINE)


register_method("ar", lambda k: SpecConfig(method="ar"), uses_k=False,
                description="plain autoregressive decoding (the baseline)")
register_method("sd-draft", lambda k: SpecConfig(method="sd-draft", k=k), needs_draft=True,
                description="speculative decoding with a draft model")
register_method("sd-ngram", lambda k: SpecConfig(method="sd-ngram", k=k),
                description="speculative decoding with prompt lookup (n-gram)")
register_method("auto", lambda k: SpecConfig(method="auto", k=k, proposer="draft"), needs_draft=True,
                description="goodput controller over the draft model: K chosen each round in 0..k")
register_method("auto-ngram", lambda k: SpecConfig(method="auto", k=k, proposer="ngram"),
                description="goodput controller over prompt lookup: K chosen each round in 0..k")
register_method("ssd", lambda k: SpecConfig(method="ssd", k=k), needs_draft=True,
                description="speculative speculative decoding: a speculator process pre-drafts for likely outcomes")
register_method("heuristic", lambda k: SpecConfig(method="heuristic", k=k, proposer="draft"), needs_draft=True,
                description="draft model, K += 2 after a full acceptance else K -= 1 (max k)")
