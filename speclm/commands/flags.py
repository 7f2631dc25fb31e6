"""Command-line flags generated from the declared settings (speclm/options.py):
each flag, default and help line is written once, on its dataclass field, and
every command that uses a setting shows the same flag. The command modules
import from here; nothing here imports them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import InvalidRequestError
from ..options import Option, options_of
from ..speculative.config import SpecConfig, spec_options
from ..speculative.methods import get_method
from ..speculative.ssd.client import SpeculatorConfig


def _checked(kind: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    """kind as an argparse type: a builtin type as is (argparse's own message on a bad
    value), a parsing function with its own refusal as the usage error's message."""
    if kind in (int, float, str):
        return kind

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except InvalidRequestError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _csv(kind: Callable[[str], Any], flag: str) -> Callable[[str], list]:
    one = _checked(kind, flag)

    def parse(text: str) -> list:
        items = [one(x.strip()) for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{flag} needs at least one value")
        return items
    return parse


def _shown(default: Any) -> str:
    """ (default X) for a help line; nothing for an empty default."""
    if default in (None, False, (), []):
        return ""
    return f" (default {','.join(map(str, default)) if isinstance(default, (list, tuple)) else default})"


def add_option(group, opt: Option, unset: bool = False) -> None:
    """One declared setting as a flag (dest: Option.dest). unset: a flag not given parses
    as None (a command that fills it from a preset, `values(..., preset)`, needs to know)."""
    metavar = opt.metavar or (None if opt.choices else opt.flag.lstrip("-").upper().replace("-", "_"))
    help_ = opt.help + _shown(opt.flag_default)
    if opt.kind is bool:
        group.add_argument(opt.flag, dest=opt.dest, action="store_true", help=opt.help)
    elif opt.many == "repeat":
        group.add_argument(opt.flag, dest=opt.dest, action="append", type=_checked(opt.kind, opt.flag),
                           default=None, metavar=metavar, help=help_)
    elif opt.many == "csv":
        group.add_argument(opt.flag, dest=opt.dest, type=_csv(opt.kind, opt.flag), default=None,
                           metavar=metavar, help=help_)
    else:
        group.add_argument(opt.flag, dest=opt.dest, type=_checked(opt.kind, opt.flag),
                           default=None if unset else opt.flag_default, choices=opt.choices, metavar=metavar,
                           help=help_)


def add_options(p: argparse.ArgumentParser, cls: type, title: str | None = None,
                skip: Iterable[str] = (), unset: bool = False) -> None:
    """A flag for every declared option of dataclass `cls` (but the fields in `skip`)."""
    group = p.add_argument_group(title) if title else p
    for opt in options_of(cls):
        if opt.cli and opt.name not in skip:
            add_option(group, opt, unset)


def values(args: argparse.Namespace, cls: type, section: str | None = None,
           preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """{field: value} of `cls`'s options that the parsed flags hold; a flag not given
    takes `preset`'s value for it, else its command-line default."""
    out = {}
    for opt in options_of(cls, section):
        if hasattr(args, opt.dest):
            value = getattr(args, opt.dest)
            out[opt.name] = (preset or {}).get(opt.name, opt.flag_default) if value is None else value
    return out


def build(args: argparse.Namespace, cls: type, preset: dict[str, Any] | None = None, **extra: Any) -> Any:
    """cls from the parsed flags (a preset filling what was not given, and `extra`
    fields); validated by cls itself."""
    return cls(**{**values(args, cls, preset=preset), **extra})


# ---- speculation ------------------------------------------------------------------
def add_spec_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """A flag for every declared SpecConfig option (except the field names in
    `skip`), method sections in their own group, plus the speculator's placement."""
    groups: dict[str | None, Any] = {None: p.add_argument_group("speculation")}
    dests = []
    for opt in spec_options():
        if not opt.cli or opt.name in skip:
            continue
        dests.append(opt.dest)
        if opt.section not in groups:
            groups[opt.section] = p.add_argument_group(f"{opt.section.upper()} (method {opt.section})")
        add_option(groups[opt.section], opt)
    p.set_defaults(spec_dests=tuple(dests))  # what spec_from_args reads back
    speculator = groups.setdefault("ssd", p.add_argument_group("SSD (method ssd)"))
    for opt in options_of(SpeculatorConfig):
        add_option(speculator, opt)


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    """The SpecConfig the flags describe (flags a command lacks keep their defaults); validated."""
    dests = set(getattr(args, "spec_dests", ()))
    return SpecConfig().with_options(**{opt.name: getattr(args, opt.dest) for opt in spec_options()
                                        if opt.dest in dests})


def speculator_config(args: argparse.Namespace) -> SpeculatorConfig:
    """The SSD speculator's placement from its flags."""
    return build(args, SpeculatorConfig)


def kernels_for(spec: SpecConfig) -> str:
    """What auto kernels should be fastest at for a command whose default method is spec's."""
    return "speculation" if get_method(spec.method).uses_k else "decoding"


def llm_arguments(args: argparse.Namespace, spec: SpecConfig, **kw: Any) -> dict[str, Any]:
    """LLM's keyword arguments from the model flags (LoadConfig): its kernels chosen for
    spec's method, the speculator placed by its flags; `kw`: more LLM arguments."""
    from ..backends.load import LoadConfig
    load = build(args, LoadConfig)
    return dict(target=load.target, draft=draft_for(args, spec), n_ctx=load.n_ctx, n_threads=load.n_threads,
                kernels=load.kernels, kernels_for=kernels_for(spec), speculator=speculator_config(args), **kw)


def open_llm(args: argparse.Namespace, spec: SpecConfig, **kw: Any):
    """The LLM `llm_arguments` describes."""
    from ..api import LLM
    return LLM(**llm_arguments(args, spec, **kw))


def draft_for(args: argparse.Namespace, spec: SpecConfig) -> str | None:
    """The draft model to load: --draft as given, else the default target's default
    draft when `spec` drafts with a model (models/registry.py: default_draft)."""
    from ..models.registry import default_draft
    if args.draft is not None:
        return args.draft
    return default_draft(args.target) if get_method(spec.method).needs_draft(spec, has_draft=True) else None


def add_json_option(p: argparse.ArgumentParser) -> None:
    """--json: the command prints one JSON object instead of its text."""
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
