"""llama.cpp kernel configurations: which matmul paths a model runs on.

A configuration is two switches (docs/kernels.md):
- buffers: where llama.cpp puts the weights. "amx" (the AMX buffer type, Intel
  Sapphire Rapids and later, compiled in when the build's CPU has AMX),
  "repack" (CPU_REPACK: weights re-laid out for multi-row kernels), "speclm"
  (speclm's own multi-row kernels for Q4_K, Q6_K and the 32-value formats Q4_0, Q4_1,
  Q5_0, Q8_0, IQ4_NL in ggml's layout, the rest repacked: speclm.native), "speclm-repack" (speclm's kernels on
  its own interleaved X16 layout, sixteen weight rows a register, on which they
  compute every forward, one row included) or "plain" (`use_extra_bufts = False`: the plain vec_dot kernels).
- tiled: llama.cpp's tiled multi-row matmul for weights that are not repacked
  (`GGML_CPU_TILED_MM`, used at 8 rows and more).

Both are partly process-wide: llama.cpp reads GGML_CPU_TILED_MM once, and
decides once whether AMX is usable (`ggml_amx_init`). So the first model a
process loads fixes the tiled switch and whether AMX is masked
(`ProcessKernels`), and later loads choose among the configurations that fit.

"repack" on a build with AMX compiled in needs AMX masked: llama.cpp lists the
AMX buffer type first and uses it whenever `arch_prctl(ARCH_REQ_XCOMP_PERM)`
succeeds. A seccomp filter makes that one call fail with EPERM, so llama.cpp
says "AMX is not ready" and falls back to CPU_REPACK (the kernels a build
without AMX would use). The filter is inherited by child processes and cannot
be lifted; nothing else is filtered.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass

from ..errors import InvalidRequestError

BUFFERS = ("amx", "repack", "speclm", "speclm-repack", "plain")
TILED_ENV = "GGML_CPU_TILED_MM"
KERNELS_ENV = "SPECLM_KERNELS"  # the user's choice when none is passed (auto, a family or a configuration)
USER_TILED = os.environ.get(TILED_ENV)  # the user's own setting, read before speclm sets it
REFERENCE = "plain"  # the configuration every other one is checked against: plain kernels, untiled


@dataclass(frozen=True)
class KernelConfig:
    """One kernel configuration: weight buffers and the tiled multi-row switch."""

    buffers: str
    tiled: bool

    @property
    def name(self) -> str:
        return self.buffers + ("+tiled" if self.tiled else "")

    @property
    def use_extra_bufts(self) -> bool:
        return self.buffers != "plain"

    @property
    def claims(self) -> bool:
        """Whether speclm's own kernels take this model's matmul weights of the types they handle."""
        return self.buffers.startswith("speclm")

    @property
    def interleaved(self) -> bool:
        """Whether the weights are interleaved: by CPU_REPACK (repack) or in speclm's X16 layout
        (speclm-repack; docs/kernels.md)."""
        return self.buffers in ("repack", "speclm-repack")

    def __str__(self) -> str:
        return self.name


def parse_config(name: str) -> KernelConfig:
    """A configuration by name ("repack", "plain+tiled", ...)."""
    base, plus, tiled = name.partition("+")
    if base not in BUFFERS or (plus and tiled != "tiled"):
        raise InvalidRequestError(f"unknown kernels {name!r}: choose auto, one of {', '.join(BUFFERS)} "
                                  f"(the best of that family), or a configuration such as repack+tiled")
    return KernelConfig(base, bool(tiled))


def check_request(request: str | None) -> str:
    """The kernels request to honour: `request`, else $SPECLM_KERNELS, else auto; validated."""
    value = request if request is not None else os.environ.get(KERNELS_ENV) or "auto"
    if not isinstance(value, str):
        raise InvalidRequestError(f"kernels must be a string (auto or one of {', '.join(BUFFERS)}), got {value!r}")
    value = value.strip().lower()
    if value != "auto":
        parse_config(value)
    return value


def matches(request: str, config: KernelConfig) -> bool:
    """Whether `config` satisfies a request: auto, a family (repack) or an exact name."""
    return request == "auto" or request in (config.buffers, config.name)


@dataclass(frozen=True)
class BuildInfo:
    """What this llama.cpp build can run: its own system-info line, parsed."""

    system_info: str
    amx: bool  # the AMX buffer type is compiled in (AMX_INT8 in the build's features)
    repack: bool
    speclm: str | None = None  # why speclm's own kernels cannot run in this process (None: they can)

    def configs(self) -> list[KernelConfig]:
        """Every configuration this build can realise, llama.cpp's default first. speclm's
        families come tiled only: untiled, prefill chunks past their 64 rows would run ggml's
        one-row kernels over the weights they hold (Q4_K, Q6_K, ...), which the probe's curve does not see
        (docs/kernels.md#configurations)."""
        families = [b for b in BUFFERS if self.unavailable(b) is None]
        return [KernelConfig(b, t) for b in families for t in (True, False) if t or not b.startswith("speclm")]

    def unavailable(self, family: str) -> str | None:
        """Why a family cannot run with this build (None: it can)."""
        if family == "amx" and not self.amx:
            return ("this llama.cpp build has no AMX kernels (its CPU features: "
                    f"{self.system_info or 'unknown'}); AMX needs an Intel CPU with AMX and a build made on it")
        if family == "repack" and not self.repack:
            return "this llama.cpp build has no CPU_REPACK kernels"
        if family.startswith("speclm") and self.speclm is not None:
            return self.speclm
        return None


@functools.cache
def build_info() -> BuildInfo:
    from .. import native
    from ..llama_lib import L, init_once
    init_once()  # registers speclm's kernels, if they can run, before any model loads
    text = L.llama_print_system_info().decode("utf-8", "replace").strip()
    flags = dict(re.findall(r"(\w+) = (\d+)", text))
    ours = native.status()
    return BuildInfo(text, flags.get("AMX_INT8") == "1", flags.get("REPACK") == "1",
                     None if ours.available else ours.reason)


# ---- process-wide settings ----------------------------------------------------------
@dataclass
class ProcessKernels:
    """The process-wide half of the configuration, fixed by the first model load."""

    tiled: bool | None = None  # None: no model loaded yet
    amx_masked: bool = False
    fixed_by: str | None = None  # the model whose load fixed them

    def fits(self, config: KernelConfig, build: BuildInfo) -> str | None:
        """Why `config` cannot run in this process (None: it can)."""
        if USER_TILED is not None and (USER_TILED.strip() not in ("0", "")) != config.tiled:
            return f"{TILED_ENV}={USER_TILED} is set in the environment (unset it to let speclm choose)"
        if self.tiled is not None and config.tiled != self.tiled:
            return (f"this process already runs llama.cpp with tiled matmul {'on' if self.tiled else 'off'} "
                    f"(fixed when {self.fixed_by} was loaded; llama.cpp reads {TILED_ENV} once)")
        if config.buffers == "amx" and self.amx_masked:
            return f"AMX is masked in this process (fixed when {self.fixed_by} was loaded)"
        if config.buffers != "amx" and build.amx and self.tiled is not None and not self.amx_masked:
            return (f"this process already uses AMX (fixed when {self.fixed_by} was loaded); "
                    f"{config.name} on an AMX build needs AMX masked from the start")
        return None


PROCESS = ProcessKernels()


def apply(config: KernelConfig, model: str, build: BuildInfo | None = None) -> None:
    """Set the process-wide switches `config` needs before its model loads (the
    first load fixes them: callers check ProcessKernels.fits first). Child
    processes inherit them (the tiled switch through the environment)."""
    build = build or build_info()
    if PROCESS.tiled is not None:
        return
    os.environ[TILED_ENV] = "1" if config.tiled else "0"
    if config.buffers != "amx" and build.amx:
        mask_amx()
        PROCESS.amx_masked = True
    PROCESS.tiled, PROCESS.fixed_by = config.tiled, model


# ---- the AMX mask -------------------------------------------------------------------
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_AUDIT_ARCH_X86_64, _NR_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM = 0xC000003E, 158, 0x1023
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_LD_ABS, _JEQ, _RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def mask_amx() -> None:
    """Make arch_prctl(ARCH_REQ_XCOMP_PERM, ...) fail with EPERM in this process and
    its children (x86-64 Linux), so llama.cpp cannot enable AMX. Irreversible."""
    program = [
        (_LD_ABS, 0, 0, 4),                          # seccomp_data.arch
        (_JEQ, 0, 5, _AUDIT_ARCH_X86_64),            # another ABI: allow
        (_LD_ABS, 0, 0, 0),                          # seccomp_data.nr
        (_JEQ, 0, 3, _NR_ARCH_PRCTL),                # another syscall: allow
        (_LD_ABS, 0, 0, 16),                         # low half of args[0]
        (_JEQ, 0, 1, ARCH_REQ_XCOMP_PERM),           # another arch_prctl: allow
        (_RET, 0, 0, _RET_EPERM),
        (_RET, 0, 0, _RET_ALLOW),
    ]
    filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    prog = _SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise InvalidRequestError(f"cannot mask AMX in this process ({os.strerror(err)}): use --kernels plain, "
                                  f"or a llama-cpp-python built without AMX (docs/kernels.md)")
