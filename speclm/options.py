"""Settings declared once: a dataclass field with `option(...)` carries its
help text, its command-line flag and whether an HTTP request may set it.

`speclm generate`, `bench` and `serve` generate their flags from these fields
(`speclm.commands.options`), and the server generates its request fields from the
ones marked `request=True`; nobody repeats a name, a default or a help line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any


def option(default: Any, help: str, *, kind: Callable[[str], Any] | None = None, flag: str | None = None,
           choices: Callable[[], tuple[str, ...]] | tuple[str, ...] | None = None,
           request: bool = False, cli: bool = True) -> Any:
    """A dataclass field with its user-facing description.

    kind: the argparse type (default: type(default), str for None); flag: the
    command-line flag (default --field-name); choices: allowed values (a
    callable is read when the parser is built, so tables can grow); request:
    settable per HTTP request; cli: has a command-line flag at all.
    """
    meta = {"help": help, "kind": kind, "flag": flag, "choices": choices, "request": request, "cli": cli}
    return dataclasses.field(default=default, metadata={"option": meta})


@dataclasses.dataclass(frozen=True)
class Option:
    """One declared setting, as the CLIs and the server see it."""

    name: str  # the field name: also the HTTP request field name
    section: str | None  # None: a field of SpecConfig; else the SpecConfig field holding its dataclass
    default: Any
    help: str
    kind: Callable[[str], Any]
    flag: str
    choices: tuple[str, ...] | None
    request: bool
    cli: bool

    @property
    def dest(self) -> str:
        """The argparse destination (unique across sections)."""
        return self.name if self.section is None else f"{self.section}.{self.name}"


def options_of(cls: type, section: str | None = None) -> Iterator[Option]:
    """Every `option(...)` field of dataclass `cls`, in declaration order."""
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
        kind = meta["kind"] or (str if f.default is None else type(f.default))
        yield Option(f.name, section, f.default, meta["help"], kind,
                     meta["flag"] or "--" + f.name.replace("_", "-"), choices, meta["request"], meta["cli"])
