"""Settings declared once: a dataclass field with `option(...)` carries its
default, help text, command-line flag, whether an HTTP request may set it,
and which proposals read it.

Every command's flags are generated from these fields
(`speclm.commands.flags.add_options`), and the server generates its request
fields from the ones marked `request` (`speclm.server.schemas`); nobody
repeats a name, a default or a help line. The dataclasses that declare
settings: SamplingParams (sampling.py), LoadConfig (backends/load.py),
SpecConfig and its method sections (speculative/config.py), SpeculatorConfig
(speculative/ssd/launch.py), ServerConfig and ListenConfig (server/), and the
bench's and trust policy's configs (bench/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any


def option(default: Any, help: str, *, kind: Callable[[str], Any] | None = None, flag: str | None = None,
           choices: Callable[[], tuple[str, ...]] | tuple[str, ...] | None = None,
           request: bool | str = False, cli: bool = True, many: str | None = None,
           metavar: str | None = None, reads: tuple[str, ...] | None = None,
           default_factory: Callable[[], Any] | None = None, cli_default: Any = None) -> Any:
    """A dataclass field with its user-facing description.

    kind: the type of one value on the command line (default: type(default), str
    for None); flag: the command-line flag (default --field-name); choices:
    allowed values (a callable is read when the parser is built, so tables can
    grow); request: settable per HTTP request (True: under the field's name, a
    string: under that name); cli: has a flag at all; many: the field holds
    several values, given "csv" (comma-separated) or "repeat" (the flag
    repeated); reads: the proposals that use this setting (None: every request),
    so setting it for another is an error (SpecConfig checks); cli_default: the
    command line's default where it deliberately differs from the library's
    (say why in the help).
    """
    meta = {"help": help, "kind": kind, "flag": flag, "choices": choices, "request": request, "cli": cli,
            "many": many, "metavar": metavar, "reads": reads, "cli_default": cli_default}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={"option": meta})
    return dataclasses.field(default=default, metadata={"option": meta})


@dataclasses.dataclass(frozen=True)
class Option:
    """One declared setting, as the commands and the server see it."""

    name: str  # the field name
    section: str | None  # a field of a nested settings dataclass: the field holding it; else None
    default: Any
    help: str
    kind: Callable[[str], Any]
    flag: str
    choices: tuple[str, ...] | None
    request: str | None  # the HTTP request field's name (None: not settable per request)
    cli: bool
    many: str | None
    metavar: str | None
    reads: tuple[str, ...] | None
    cli_default: Any = None

    @property
    def flag_default(self) -> Any:
        """The default on the command line."""
        return self.default if self.cli_default is None else self.cli_default

    @property
    def dest(self) -> str:
        """The argparse destination (unique across sections)."""
        return self.name if self.section is None else f"{self.section}.{self.name}"


def options_of(cls: type, section: str | None = None, key: str = "option") -> Iterator[Option]:
    """Every `option(...)` field of dataclass `cls`, in declaration order. key: the
    metadata key of the declarations (another command line of the same fields keeps
    its own, e.g. the SSD worker's: speculative/ssd/launch.py)."""
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(key)
        if meta is None:
            continue
        choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kind = meta["kind"] or (str if default is None or meta["many"] else type(default))
        request = f.name if meta["request"] is True else (meta["request"] or None)
        yield Option(f.name, section, default, meta["help"], kind,
                     meta["flag"] or "--" + f.name.replace("_", "-"), choices, request, meta["cli"],
                     meta["many"], meta["metavar"], meta["reads"], meta["cli_default"])


SWEPT = "; comma-separated values are swept"  # what a sweep adds to the help of the setting it sweeps


def described(cls: type, name: str, more: str = "") -> str:
    """The declared help of `cls.name` (with `more` after it): a setting that sweeps or
    builds on another one says what that one is in the same words."""
    return next(o.help for o in options_of(cls) if o.name == name) + more
