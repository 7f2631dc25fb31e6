"""Facts about this machine that every layer may record: the CPU model and the
instruction sets that decide which llama.cpp kernels can run (docs/kernels.md);
how busy other processes keep the CPUs now (`busy_cpus`, `busy_warning`); and the
two calls to the C library a long-lived process needs (`reuse_freed_buffers`,
`return_freed_memory`)."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import time
from collections.abc import Callable
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


SAMPLE_S = 1.0  # how long `busy_cpus` watches the CPUs


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, all) clock ticks every CPU has spent since boot, from /proc/stat's first
    line (idle and iowait are not busy); None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    return sum(fields) - fields[3] - fields[4], sum(fields)


def busy_cpus(seconds: float = SAMPLE_S, ticks: Callable[[], tuple[int, int] | None] = _cpu_ticks,
              own_cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> float:
    """How many CPUs other processes keep busy now: the busy share of every CPU's time
    over a `seconds` sample (/proc/stat), times the cores, less this process's own CPU
    time in it (all its threads). Not the load average, which remembers the last
    minute: a compile that just ended would read as busy for a minute after it. Where
    there is no /proc/stat (not Linux), the 1-minute load average."""
    before, own, wall = ticks(), own_cpu(), clock()
    if before is None:
        return os.getloadavg()[0]
    sleep(seconds)
    after = ticks()
    own, wall = own_cpu() - own, max(clock() - wall, seconds)
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return 0.0
    return max(0.0, busy / total * (os.cpu_count() or 1) - own / wall)


def busy_warning(busy: float, cores: int, fix: str = "rerun on a quiet machine") -> str | None:
    """A loud warning when other processes keep more than half the cores busy
    (`busy_cpus`), else None: llama.cpp's threads wait for each other, so anything else
    running inflates every timing."""
    if busy > cores * 0.5:
        return (f"MACHINE BUSY: other processes keep {busy:.2f} of {cores} cores busy (> {cores * 0.5:.1f}) "
                f"at start; llama.cpp threads wait for each other, so timings are unreliable: {fix}")
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
