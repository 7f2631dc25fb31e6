"""Command-line options shared by `speclm generate`, `bench` and `serve`:
generated from SpecConfig's declared options, so each flag, default and help
line is written once (speclm.speculative.config). The three command modules
import from here; nothing here imports them."""

from __future__ import annotations

import argparse

from ..errors import InvalidRequestError
from ..speculative.config import SpecConfig, spec_options
from ..speculative.methods import get_method

SPECULATOR_FLAGS = ("--speculator-threads", "--speculator-cores", "--speculator-addr", "--speculator-timeout")


def _kernels(text: str) -> str:
    from ..backends.kernels import check_request
    try:
        return check_request(text)
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_kernels_option(p: argparse.ArgumentParser) -> None:
    """--kernels: the llama.cpp kernels every model of the command loads with."""
    p.add_argument("--kernels", type=_kernels, default=None, metavar="auto|amx|repack|plain",
                   help="llama.cpp kernels: auto (default; $SPECLM_KERNELS overrides) proves each configuration "
                        "on this machine in a child process once and takes the fastest that works; a family "
                        "(amx, repack, plain) or a configuration (e.g. repack+tiled) forces it "
                        "(`speclm doctor` shows the verdicts)")


def kernels_for(spec: SpecConfig) -> str:
    """What auto kernels should be fastest at for a command whose default method is spec's."""
    return "decoding" if get_method(spec.method).proposal is None else "speculation"


def add_spec_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add a flag for every declared SpecConfig option (except the field names in
    `skip`), method sections in their own group, plus the speculator's placement."""
    groups: dict[str | None, argparse._ArgumentGroup] = {None: p.add_argument_group("speculation")}
    dests = []
    for opt in spec_options():
        if not opt.cli or opt.name in skip:
            continue
        dests.append(opt.dest)
        if opt.section not in groups:
            groups[opt.section] = p.add_argument_group(f"{opt.section.upper()} (method {opt.section})")
        default = f" (default {opt.default})" if opt.default is not None else ""
        if opt.kind is bool:
            groups[opt.section].add_argument(opt.flag, dest=opt.dest, action="store_true", help=opt.help)
            continue
        groups[opt.section].add_argument(opt.flag, dest=opt.dest, type=opt.kind, default=opt.default,
                                         choices=opt.choices, help=opt.help + default)
    p.set_defaults(spec_dests=tuple(dests))  # what spec_from_args reads back
    s = groups.setdefault("ssd", p.add_argument_group("SSD (method ssd)"))
    s.add_argument("--speculator-threads", type=int, default=1, help="draft threads in the speculator (default 1)")
    s.add_argument("--speculator-cores", default=None, help="pin the speculator to these cores, e.g. 1 or 2,3")
    s.add_argument("--speculator-addr", default=None,
                   help="use a running `speclm speculator` at this ZeroMQ address instead of spawning one")
    s.add_argument("--speculator-timeout", type=float, default=10.0,
                   help="seconds to wait for a block before finishing on the synchronous path (default 10)")


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    """The SpecConfig the flags describe (flags a command lacks keep their defaults); validated."""
    dests = set(getattr(args, "spec_dests", ()))
    values = {opt.name: getattr(args, opt.dest) for opt in spec_options() if opt.dest in dests}
    return SpecConfig().with_options(**values)


def wants_draft(spec: SpecConfig) -> bool:
    """Whether `spec` drafts with the draft model when one is available (CLIs load
    the default draft for the default target only when it does)."""
    return get_method(spec.method).needs_draft(spec, has_draft=True)


def draft_for(args: argparse.Namespace, spec: SpecConfig) -> str | None:
    """The --draft to load: as given, else the default draft for the default target if `spec` wants one."""
    if args.draft is not None or args.target is not None or not wants_draft(spec):
        return args.draft
    from ..models.registry import DEFAULT_DRAFT
    return DEFAULT_DRAFT


def speculator_config(args: argparse.Namespace):
    """The SSD speculator's placement from --speculator-* flags."""
    from ..speculative.ssd.client import SpeculatorConfig
    try:
        cores = tuple(int(c) for c in args.speculator_cores.split(",")) if args.speculator_cores else None
    except ValueError:
        raise InvalidRequestError(f"--speculator-cores takes core numbers like 1 or 2,3, "
                                  f"got {args.speculator_cores!r}") from None
    if args.speculator_threads < 1 or args.speculator_timeout <= 0:
        raise InvalidRequestError("--speculator-threads must be >= 1 and --speculator-timeout > 0")
    return SpeculatorConfig(threads=args.speculator_threads, cores=cores, addr=args.speculator_addr,
                            timeout_s=args.speculator_timeout)
