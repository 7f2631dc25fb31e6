"""Facts about this machine that every layer may record: the CPU model and the
instruction sets that decide which llama.cpp kernels can run (docs/kernels.md);
and the two calls to the C library a long-lived process needs (`reuse_freed_buffers`,
`return_freed_memory`)."""

from __future__ import annotations

import ctypes
import functools
import platform
from pathlib import Path

ISA_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "bmi2")  # the flags kernel choices depend on


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_model() -> str:
    """'model name' from /proc/cpuinfo, else platform.processor()."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_flags() -> tuple[str, ...]:
    """Every CPU flag /proc/cpuinfo lists, sorted (empty where it lists none)."""
    return tuple(sorted(set(_cpuinfo().get("flags", "").split())))


def isa_flags() -> tuple[str, ...]:
    """The instruction-set flags that matter to llama.cpp's kernels (AVX*, AMX*, FMA, F16C, ...)."""
    return tuple(f for f in cpu_flags() if f.startswith(ISA_PREFIXES))


def busy_warning(load1: float, cores: int, fix: str = "rerun on a quiet machine") -> str | None:
    """A loud warning when the 1-minute load exceeds half the cores, else None: llama.cpp's
    threads wait for each other, so anything else running inflates every timing."""
    if load1 > cores * 0.5:
        return (f"MACHINE BUSY: load average {load1:.2f} on {cores} cores (> {cores * 0.5:.1f}) at start; "
                f"llama.cpp threads wait for each other, so timings are unreliable: {fix}")
    return None


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (it has malloc_trim), else None."""
    try:
        lib = ctypes.CDLL("libc.so.6")
        trim = lib.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return lib


# glibc's mallopt parameters, and the values `reuse_freed_buffers` sets
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_BELOW = 32 << 20  # glibc's own ceiling for its adaptive mmap threshold on 64-bit
TRIM_ABOVE = 128 << 20


def reuse_freed_buffers() -> bool:
    """Have glibc serve blocks under 32 MiB from memory it already holds and keep up to
    128 MiB free before giving any back (fixed thresholds, mallopt): the logits rows and
    distributions every step allocates and frees then reuse pages, where glibc's adaptive
    thresholds had the scheduler thread fault in fresh zeroed pages, about 5,000 a 16-row
    step (docs/results.md#u9). `return_freed_memory` still gives back what is held.
    Process-wide; False where the C library is not glibc."""
    lib = _glibc()
    if lib is None:
        return False
    return bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_BELOW)) and bool(lib.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))


def return_freed_memory() -> bool:
    """Give the operating system back the memory glibc keeps after frees (malloc_trim(0)):
    blocks of varying size (prefix-cache KV copies, logits rows) freed by a long-lived
    server otherwise stay resident (docs/results.md#u6). False where the C library is not
    glibc. Costs 0.2-0.5 ms with the 1.5B target loaded."""
    lib = _glibc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True
