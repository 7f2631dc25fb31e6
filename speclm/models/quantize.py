"""Requantising a GGUF file with llama.cpp's own quantizer (variants.py uses it)."""

from __future__ import annotations

from pathlib import Path

from ..llama_lib import L, init_once, last_error, recent_errors


def quantize(source: Path, out: Path, ftype: int, n_threads: int | None = None, pure: bool = False) -> None:
    """Requantise GGUF `source` into `out` with llama.cpp's quantizer (ftype: a
    LLAMA_FTYPE_* value); RuntimeError carrying llama.cpp's own reason on failure.
    `pure`: every quantisable tensor gets the ftype's type, the output head and the
    token embedding too (otherwise llama.cpp keeps those at a higher type, e.g. Q6_K)."""
    init_once()
    params = L.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the shipped models are already quantised
    params.nthread = n_threads or 0  # 0: all cores
    params.pure = bool(pure)  # output_tensor_type / token_embedding_type stay "unset": pure covers them
    recent_errors.clear()
    if L.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(last_error())
