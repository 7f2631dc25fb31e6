"""speclm's own multi-row matmul kernels, loaded into llama.cpp's CPU backend.

The C++ library (`quant_gemm.cpp`, `buffer_type.cpp` beside this file) is built by the
install (setup.py; an install where it cannot build still works, without it). `register`
puts its buffer type first in libggml-cpu's list before the process loads a model; it checks
ggml's layouts first and refuses, with a reason, on any llama-cpp-python it was not written
for. A model then uses these kernels only when loaded while `claiming` (the `speclm` kernel
configurations); every other model runs on llama.cpp's kernels exactly as before. The `speclm`
configuration keeps the weights in ggml's layout (one-row forwards then run llama.cpp's vec_dot on
them); `speclm-repack` keeps Q4_K, Q6_K and the 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) with
rows in sixteens in speclm's own interleaved layout (X16), where every forward on them, one row
included, runs speclm's kernels (a Q4_K weight with rows in eights but not sixteens: CPU_REPACK's
layout, as before).
docs/kernels.md#speclms-kernels has the whole contract.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PINNED_LLAMA_CPP = "0.3.36"  # the llama-cpp-python whose ggml ggml_abi.h declares (pyproject.toml pins it)
DISABLE_ENV = "SPECLM_NATIVE"  # "0": never load the library (llama.cpp's kernels only)
ROWS_ENV = "SPECLM_NATIVE_ROWS"  # "LO-HI": the activation rows these kernels take (default ROWS)
ISA_ENV = "SPECLM_NATIVE_ISA"  # "avx2": run the AVX2 kernels on an AVX-512 CPU (to measure them)
ROWS = (2, 64)  # one-row decode stays on llama.cpp's kernels; prefill chunks past 64 rows too
ISAS = {1: "avx2", 2: "avx512-vnni"}
# q4_0 .. iq4_nl: the 32-value block formats, their activations quantised per 32 values as ggml's Q8_0
# does (quant_gemm.h: Activations32); 2 is unused
# q4_0_x16 .. iq4_nl_x16, q4_K_x16, q6_K_x16: those formats in speclm's interleaved layout (quant_gemm_q32x16.cpp,
# quant_gemm_k16.cpp; `gemm` repacks the GGUF bytes it is given)
WEIGHT_TYPES = {"q4_K": 0, "q6_K": 1, "q4_0": 3, "q4_1": 4, "q5_0": 5, "q8_0": 6, "iq4_nl": 7,
                "q4_0_x16": 8, "q4_1_x16": 9, "q5_0_x16": 10, "q8_0_x16": 11, "iq4_nl_x16": 12,
                "q4_K_x16": 13, "q6_K_x16": 14}


@dataclass(frozen=True)
class Status:
    """Whether speclm's kernels run in this process, and if not, why."""

    available: bool
    reason: str  # what runs (the ISA) or why nothing does
    isa: str | None = None


_lib: ctypes.CDLL | None = None
_status: Status | None = None


def library_path() -> Path | None:
    """The built library (None: the install did not build it)."""
    found = sorted(Path(__file__).parent.glob("_kernels*.so"))
    return found[0] if found else None


def _load() -> ctypes.CDLL | str:
    """The library, or why it cannot be used."""
    if os.environ.get(DISABLE_ENV, "").strip() == "0":
        return f"{DISABLE_ENV}=0 is set"
    path = library_path()
    if path is None:
        return ("speclm's kernels were not built by the install (a C++ compiler is needed: "
                "reinstall speclm with g++ present)")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return f"speclm's kernel library does not load ({exc})"
    lib.speclm_kernels_register.argtypes = [ctypes.c_char_p]
    lib.speclm_kernels_error.restype = ctypes.c_char_p
    lib.speclm_kernels_claim.argtypes = [ctypes.c_int]
    lib.speclm_kernels_rows.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speclm_kernels_isa.argtypes = [ctypes.c_int]
    lib.speclm_kernels_handled.restype = ctypes.c_long
    lib.speclm_kernels_interleaved.argtypes = [ctypes.c_int]
    lib.speclm_gemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.speclm_gemm.restype = ctypes.c_double
    lib.speclm_repack_x16.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_int]
    return lib


def rows_range() -> tuple[int, int]:
    """The activation-row range the kernels take: $SPECLM_NATIVE_ROWS ("LO-HI"), else ROWS."""
    text = os.environ.get(ROWS_ENV, "").strip()
    if not text:
        return ROWS
    lo, _, hi = text.partition("-")
    try:
        lo_i, hi_i = int(lo), int(hi)
    except ValueError:
        lo_i = hi_i = 0
    if not 1 <= lo_i <= hi_i:
        raise ValueError(f"{ROWS_ENV}={text!r}: give LO-HI with 1 <= LO <= HI, e.g. 2-64")
    return lo_i, hi_i


def register(llama_lib_dir: Path) -> Status:
    """Put speclm's buffer type into llama.cpp (once per process, before the first model load;
    llama_lib.init_once calls it). Never raises: a library that cannot register leaves
    llama.cpp's kernels in charge and says why in `status()`."""
    global _lib, _status
    if _status is not None:
        return _status
    loaded = _load()
    if isinstance(loaded, str):
        _status = Status(False, loaded)
        return _status
    import llama_cpp
    version = getattr(llama_cpp, "__version__", "?")
    if version != PINNED_LLAMA_CPP:
        _status = Status(False, f"llama-cpp-python {version} is installed; speclm's kernels are written for "
                                f"{PINNED_LLAMA_CPP}'s internal interface (pip install llama-cpp-python=={PINNED_LLAMA_CPP})")
        return _status
    try:
        lo, hi = rows_range()
        wanted = os.environ.get(ISA_ENV, "").strip().lower()
        if wanted and wanted not in ISAS.values():
            raise ValueError(f"{ISA_ENV}={wanted!r}: choose one of {', '.join(ISAS.values())}")
    except ValueError as exc:
        _status = Status(False, f"speclm's kernels are off: {exc}")
        return _status
    if loaded.speclm_kernels_register(str(llama_lib_dir).encode()) != 0:
        _status = Status(False, "speclm's kernels refused to register: "
                         + loaded.speclm_kernels_error().decode("utf-8", "replace"))
        return _status
    loaded.speclm_kernels_rows(lo, hi)
    _lib = loaded
    isa = force_isa(wanted) if wanted else ISAS.get(loaded.speclm_kernels_isa(0), "?")
    _status = Status(True, f"{isa} for {lo}-{hi} rows; weights in ggml's layout (speclm) or speclm's X16 "
                     "(speclm-repack: every row count)", isa)
    return _status


def status() -> Status:
    """This process's registration (not registered yet: why)."""
    return _status or Status(False, "llama.cpp has not been initialised in this process yet")


@contextmanager
def claiming(on: bool, interleaved: bool = False):
    """Models loaded inside put their Q4_K/Q6_K and 32-value-format (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL)
    matmul weights in speclm's buffer (on) or not;
    interleaved: the weights with rows in sixteens in speclm's X16 layout (`speclm-repack`)."""
    if _lib is None:
        if on:
            raise RuntimeError(f"speclm's kernels are not available: {status().reason}")
        yield
        return
    if on:
        _lib.speclm_kernels_interleaved(int(interleaved))
    _lib.speclm_kernels_claim(int(on))
    try:
        yield
    finally:
        _lib.speclm_kernels_claim(0)


def handled() -> int:
    """How many matmuls speclm's kernels have computed in this process."""
    return int(_lib.speclm_kernels_handled()) if _lib is not None else 0


def force_isa(name: str) -> str:
    """Run the `name` kernels ("avx2" on an AVX-512 CPU, to measure them); returns what runs."""
    if _lib is None:
        raise RuntimeError(f"speclm's kernels are not available: {status().reason}")
    code = {v: k for k, v in ISAS.items()}[name]
    return ISAS[_lib.speclm_kernels_isa(code)]


def _library() -> ctypes.CDLL:
    lib = _lib if _lib is not None else _load()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    return lib


def repack_x16(weight_type: str, blocks: np.ndarray, k: int, back: bool = False) -> np.ndarray:
    """Rows of a format (raw GGUF bytes, rows x bytes per row; rows a multiple of 16) in speclm's X16
    layout, or (back) X16 rows in ggml's layout again; weight_type: "q4_K", "q6_K" or "q4_0" .. "iq4_nl"."""
    lib = _library()
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    out = np.empty_like(blocks)
    if lib.speclm_repack_x16(WEIGHT_TYPES[weight_type], blocks.ctypes.data, blocks.shape[0], k, out.ctypes.data,
                             int(back)) != 0:
        raise ValueError(f"the X16 layout does not take {weight_type} {blocks.shape[0]}x{k}")
    return out


def gemm(weight_type: str, blocks: np.ndarray, k: int, x: np.ndarray, isa: str, reps: int = 0) -> np.ndarray | float:
    """out[j, r] = W[r] . x[j] by speclm's kernels, outside llama.cpp (tests): `blocks` holds the
    weight rows' raw GGUF bytes (rows x bytes per row; the _x16 types: GGUF bytes, repacked here first), x is
    (rows, k) float32. reps > 0: return the fastest of `reps` runs' thread CPU time in seconds instead
    (x's quantisation and the repacking not counted)."""
    lib = _library()
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    if weight_type.endswith("_x16"):
        blocks = repack_x16(weight_type[:-4], blocks, k)
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], blocks.shape[0]), dtype=np.float32)
    code = {v: c for c, v in ISAS.items()}[isa]
    rc = lib.speclm_gemm(WEIGHT_TYPES[weight_type], blocks.ctypes.data, blocks.shape[0], k, x.ctypes.data,
                         x.shape[0], out.ctypes.data, code, reps)
    if reps > 0 and rc > 0:
        return rc / 1e9
    if rc != 0:
        raise ValueError(f"speclm_gemm refused {weight_type} k={k} rows={x.shape[0]} isa={isa} (this CPU: "
                         f"{ISAS.get(lib.speclm_kernels_isa(0), 'none')})")
    return out
