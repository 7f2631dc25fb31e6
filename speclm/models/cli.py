"""`speclm models list|path|verify` subcommands.

Each handler takes the parsed args and returns an exit code. User-fixable
problems are raised as ModelError for the main CLI to print as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from speclm.errors import ModelError
from speclm.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY
from speclm.models.store import CorruptModelError, get_spec, list_models, repair_model, resolve_model, verify_model


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _rows() -> list[tuple[str, str, str, str, str]]:
    rows = []
    for status in list_models():
        role = status.role + (" (default)" if status.name in (DEFAULT_TARGET, DEFAULT_DRAFT) else "")
        path = str(status.path) if status.path else "-"
        rows.append((status.name, role, status.state, path, _human(REGISTRY[status.name].size)))
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    """Print a table of registered models (name, role, state, path, size)."""
    header = ("NAME", "ROLE", "STATE", "PATH", "SIZE")
    rows = _rows()
    if not sys.stdout.isatty():  # piped: plain columns, never truncated, grep-able
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table()
    for col in header:
        table.add_column(col, no_wrap=col != "PATH", overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    """Print the resolved GGUF path of a model name or local file (assembling if needed)."""
    print(resolve_model(args.name))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Fully hash each model; print OK/FAILED (REPAIRED with --repair). 1 if any still failed."""
    names = args.names or list(REGISTRY)
    for name in names:
        if name not in REGISTRY and (name.endswith(".gguf") or "/" in name):
            raise ModelError(f"{name} is a local file: verify checks registered models against their known "
                             f"sha256; a local file has none — re-download or re-convert it if it fails to load")
        get_spec(name)  # a typo is a usage error: fail before hashing anything
    failed = 0
    for name in names:
        try:
            path = verify_model(name, full=True)
            print(f"OK       {name}  {path}")
        except ModelError as exc:
            if args.repair and isinstance(exc, CorruptModelError):
                try:
                    path = repair_model(name)
                    print(f"REPAIRED {name}  {path}")
                    continue
                except ModelError as exc2:
                    exc = exc2
            failed += 1
            print(f"FAILED   {name}: {exc}")
    return 1 if failed else 0


def add_models_parser(subparsers: Any) -> None:
    """Register `models` (with list/path/verify) on an argparse subparsers object."""
    models = subparsers.add_parser("models", help="list, locate and verify the embedded GGUF models")
    sub = models.add_subparsers(dest="models_command", metavar="{list,path,verify}")
    sub.required = True

    p_list = sub.add_parser("list", help="show registered models and their state")
    p_list.set_defaults(func=cmd_list)

    p_path = sub.add_parser("path", help="print the GGUF path of a model (assembling it if needed)")
    p_path.add_argument("name", help="registered model name or local .gguf path")
    p_path.set_defaults(func=cmd_path)

    p_verify = sub.add_parser("verify", help="full sha256 check of models (all if none named)")
    p_verify.add_argument("names", nargs="*", metavar="NAME", help="registered model names")
    p_verify.add_argument("--repair", action="store_true", help="delete and reassemble corrupt assembled models")
    p_verify.set_defaults(func=cmd_verify)
