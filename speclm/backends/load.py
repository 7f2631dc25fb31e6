"""A Backend from what a user names: a registered model, a NAME@QUANT variant,
a GGUF path, or a Backend object passed through; and the draft↔target
tokenizer check every draft model must pass."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TokenizerMismatchError
from ..options import option
from .base import KV_SEQUENCES, N_CTX, Backend
from .kernels import check_request


@dataclass(frozen=True)
class LoadConfig:
    """Which models to load and how: the settings every command that loads models
    shares (their flags are generated from these fields)."""

    target: str | None = option(None, "target model: registered name, NAME@QUANT variant or GGUF path "
                                "(default: qwen2.5-coder-1.5b)")
    draft: str | None = option(None, "draft model for methods that draft with one: name or GGUF path (default: "
                               "qwen2.5-coder-0.5b when the target is the default or one of its variants and "
                               "the method drafts with a model)")
    n_ctx: int = option(N_CTX, "context length per sequence", flag="--n-ctx")
    n_threads: int | None = option(None, "CPU threads llama.cpp computes with (default: all cores)",
                                   kind=int, flag="--threads")
    kernels: str | None = option(None, "llama.cpp kernels: auto (default; $SPECLM_KERNELS overrides) proves "
                                 "each configuration on this machine in a child process once and takes the "
                                 "fastest that works; a family (amx, repack, speclm, plain) or a configuration (e.g. "
                                 "repack+tiled) forces it (`speclm doctor` shows the verdicts)",
                                 kind=check_request, metavar="auto|amx|repack|speclm|plain")


def load_backend(model: str | Backend, n_ctx: int = N_CTX, n_threads: int | None = None,
                 max_sequences: int = KV_SEQUENCES, kernels: str | None = None, work: str = "speculation") -> Backend:
    """A Backend from a registered model name, a GGUF path, or a Backend as is.

    kernels: auto (default; $SPECLM_KERNELS overrides), a family (amx, repack,
    plain) or a configuration (repack+tiled); checked on this machine in child
    processes before the load, and the best usable one for `work`
    ("speculation", "decoding", or "serving" max_sequences concurrent requests)
    taken (probe.py). The backend's `kernel_choice` says which and why."""
    if isinstance(model, Backend):
        return model
    from ..models.catalog import resolve_model
    from .llamacpp import LlamaCppBackend
    from .probe import choose_kernels
    path = resolve_model(model)
    choice = choose_kernels(path, kernels, n_threads, work, streams=max_sequences)
    backend = LlamaCppBackend(path, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=max_sequences, kernels=choice.config)
    backend.kernel_choice = choice
    return backend


def check_tokenizers(target: Backend, draft: Backend) -> None:
    """Raise TokenizerMismatchError unless every id both vocabularies hold
    decodes to the same bytes (ids beyond the shared range never match the
    target and are simply rejected)."""
    shared = min(target.vocab_size, draft.vocab_size)
    if shared < 0.9 * max(target.vocab_size, draft.vocab_size):
        raise TokenizerMismatchError(
            f"draft {draft.name} has {draft.vocab_size} tokens, target {target.name} has "
            f"{target.vocab_size}: they are different tokenizers; pick a draft from the target's family")
    for tid in range(shared):
        a, b = target.token_bytes(tid), draft.token_bytes(tid)
        if a != b:
            raise TokenizerMismatchError(
                f"draft {draft.name} and target {target.name} disagree on token id {tid} "
                f"({b!r} vs {a!r}): they use different tokenizers; pick a draft from the target's family")
