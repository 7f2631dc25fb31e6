"""Where and how the SSD speculator process runs (`SpeculatorConfig`), and the
worker's command line, generated from the same declaration.

A field declared with `worker_option(...)` is a flag of the worker process
(`speclm speculator`, ssd/worker.py) named after the field (--n-ctx for
n_ctx); the client writes a config as those flags (`worker_argv`) and the
worker reads them back (`worker_options`, `worker_config`), so a field added
here reaches the worker without a second edit. The verifier's commands show
only the fields declared with `verifier_flag`, under that flag.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...backends.base import N_CTX
from ...errors import InvalidRequestError
from ...options import Option, option, options_of
from .options import SSDOptions

MAX_SPECULATOR_SEQUENCES = 64  # llama.cpp's limit on one context's sequences
BY_HAND_MAX_SEQUENCES = 24  # `speclm speculator` without --max-sequences: 2 requests at the default fan-out
WORKER = "worker"  # the metadata key of a field's declaration as a worker flag


def core_list(text: str) -> tuple[int, ...]:
    """CPU core numbers from "1" or "2,3"."""
    try:
        cores = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise InvalidRequestError(f"cores are given as numbers like 1 or 2,3, got {text!r}") from None
    if any(c < 0 for c in cores):
        raise InvalidRequestError(f"core numbers are >= 0, got {text!r}")
    return cores


def worker_option(default: Any, help: str, *, verifier_flag: str | None = None, **kw: Any) -> Any:
    """A dataclass field that the worker process takes as --field-name, declared as
    `option(...)` declares one (kw: its keywords; cli_default: the worker's default
    where it differs). verifier_flag: the verifier's commands take it too, as that flag
    (without one they do not show it: they take every `option` of SpeculatorConfig)."""
    meta = option(default, help, **kw).metadata["option"]
    declared = {WORKER: meta}
    if verifier_flag is not None:
        declared["option"] = {**meta, "flag": verifier_flag, "cli_default": None}
    return dataclasses.field(default=default, metadata=declared)


@dataclass(frozen=True)
class SpeculatorConfig:
    """Where and how the speculator runs.

    threads: llama.cpp threads of the draft; cores: CPU cores to pin it to
    (e.g. (1,)); addr: connect to a running `speclm speculator` (e.g.
    tcp://host:5555) instead of spawning one; locate: a function that finds that
    address anew at every start and restart (a speculator that moves: Ray); timeout_s: longest wait for one
    block before the speculator counts as lost; sessions: requests it serves at
    once (None: the LLM's max_sequences); max_sequences: its KV sequences (None:
    sessions × (fan-out + 1), at most 64); kernels: as `LLM(kernels=...)`. A lost speculator is restarted by the
    next SSD request: at once the first time, then after restart_backoff_s,
    doubling while it keeps dying within stable_s of its start; after
    max_restarts such failures in a row SSD requests stay synchronous.
    """

    threads: int | None = worker_option(1, "draft threads in the speculator", kind=int,
                                        verifier_flag="--speculator-threads")
    cores: tuple[int, ...] | None = worker_option(None, "pin the speculator to these cores, e.g. 1 or 2,3",
                                                  kind=core_list, metavar="CORES", verifier_flag="--speculator-cores")
    addr: str | None = option(None, "use a running `speclm speculator` at this ZeroMQ address instead of "
                              "spawning one", flag="--speculator-addr")
    timeout_s: float = option(10.0, "seconds to wait for a block before finishing on the synchronous path",
                              flag="--speculator-timeout")
    start_timeout_s: float = 120.0
    max_sequences: int | None = worker_option(
        None, f"KV sequences of the draft: sessions × (fan-out + 1), at most {MAX_SPECULATOR_SEQUENCES}",
        kind=int, cli_default=BY_HAND_MAX_SEQUENCES)
    sessions: int | None = worker_option(
        None, "requests served at once: each may fork max-sequences / sessions - 1 branches (default: "
        f"max-sequences / (fan-out {SSDOptions().fanout} + 1))", kind=int)
    n_ctx: int = worker_option(N_CTX, "context size of the draft in tokens")
    kernels: str | None = worker_option(None, "llama.cpp kernels for the draft (default: the LLM's request; "
                                        "a speculator started by hand: auto, or $SPECLM_KERNELS)")
    max_restarts: int = 5
    restart_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stable_s: float = 60.0
    locate: Callable[[], str] | None = None  # finds a running speculator's address at each (re)start (overrides addr)

    def __post_init__(self) -> None:
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise InvalidRequestError(f"the speculator's threads must be an integer >= 1 (--speculator-threads), "
                                      f"got {self.threads!r}")
        if not self.timeout_s > 0:
            raise InvalidRequestError(f"the speculator's timeout must be > 0 s (--speculator-timeout), "
                                      f"got {self.timeout_s!r}")

    def sized(self, n_ctx: int | None = None, sessions: int | None = None) -> SpeculatorConfig:
        """This config for an LLM of n_ctx tokens serving `sessions` requests at once
        (fields set explicitly are kept)."""
        s = self.sessions or sessions or 1
        seqs = self.max_sequences or min(MAX_SPECULATOR_SEQUENCES, s * (SSDOptions().fanout + 1))
        return dataclasses.replace(self, n_ctx=n_ctx or self.n_ctx, sessions=s, max_sequences=seqs)


def worker_options() -> list[Option]:
    """SpeculatorConfig's worker flags, in declaration order: one value each (a tuple
    through its kind, as cores; not `many`). A flag's default is its cli_default, else
    None where the field may be None (left to the worker: llama.cpp's threads, no
    pinning, ...), else the field's default."""
    hints = typing.get_type_hints(SpeculatorConfig)
    out = []
    for opt in options_of(SpeculatorConfig, key=WORKER):
        assert opt.many is None and opt.kind is not bool, f"{opt.name}: the worker takes one value per flag"
        nullable = type(None) in typing.get_args(hints[opt.name])
        default = opt.flag_default if opt.cli_default is not None or not nullable else None
        out.append(dataclasses.replace(opt, default=default, cli_default=None))
    return out


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def worker_argv(cfg: SpeculatorConfig) -> list[str]:
    """cfg's worker settings as the worker's flags; a field that is None is left out
    (the worker's default applies)."""
    argv: list[str] = []
    for opt in worker_options():
        value = getattr(cfg, opt.name)
        if value is not None:
            argv += [opt.flag, _text(value)]
    return argv


def worker_config(args: Any) -> SpeculatorConfig:
    """The SpeculatorConfig that parsed worker flags (`worker_options`) describe; the
    fields the worker does not take keep their defaults."""
    return SpeculatorConfig(**{opt.name: getattr(args, opt.dest) for opt in worker_options()})


def worker_command(model: str, cfg: SpeculatorConfig, bind: str) -> list[str]:
    """The command line of a speculator worker for `model` placed by `cfg` (sized), bound
    to `bind`, exiting when this process does."""
    return [sys.executable, "-m", "speclm.speculative.ssd.worker", "--bind", bind, "--model", model,
            *worker_argv(cfg), "--parent-pid", str(os.getpid())]
