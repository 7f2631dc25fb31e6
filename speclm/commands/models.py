"""`speclm models list|path|verify|prepare|compare` subcommands.

Each handler takes the parsed args and returns an exit code. User-fixable
problems are raised as ModelError for the main CLI to print as one line.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from speclm.backends.load import LoadConfig
from speclm.commands.flags import add_json_option, add_options
from speclm.errors import ModelError
from speclm.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY
from speclm.models.catalog import list_models, resolve_model
from speclm.models.store import CorruptModelError, get_spec, repair_model, verify_model


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
        if status.name in REGISTRY:
            size = _human(REGISTRY[status.name].size)
        else:  # a prepared variant: its file's size
            size = _human(status.path.stat().st_size) if status.path and status.path.exists() else "-"
        rows.append((status.name, role, status.state, path, size))
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
    """Fully hash each model (and NAME@QUANT variant); print OK/FAILED (REPAIRED with --repair). 1 if any still failed."""
    from speclm.models import variants
    names = args.names or [*REGISTRY, *(v.name for v in variants.list_variants())]
    for name in names:
        if name not in REGISTRY and (name.endswith(".gguf") or "/" in name):
            raise ModelError(f"{name} is a local file: verify checks registered models against their known "
                             f"sha256; a local file has none — re-download or re-convert it if it fails to load")
        if variants.SEP in name and name not in REGISTRY:
            variants.split_name(name)
        else:
            get_spec(name)  # a typo is a usage error: fail before hashing anything
    failed = 0
    for name in names:
        is_variant = variants.SEP in name and name not in REGISTRY
        try:
            path = variants.verify_variant(name) if is_variant else verify_model(name, full=True)
            print(f"OK       {name}  {path}")
        except ModelError as exc:
            if args.repair and isinstance(exc, CorruptModelError):
                try:
                    path = variants.prepare_variant(*variants.split_name(name), force=True) if is_variant \
                        else repair_model(name)
                    print(f"REPAIRED {name}  {path}")
                    continue
                except ModelError as exc2:
                    exc = exc2
            failed += 1
            print(f"FAILED   {name}: {exc}")
    return 1 if failed else 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """Requantise a registered model (--pure: head and embedding too); print the derived name and its path."""
    from speclm.models.variants import derived_name, prepare_variant
    if args.threads is not None and args.threads < 1:
        raise ModelError(f"--threads must be >= 1, got {args.threads}")
    pure = getattr(args, "pure", False)
    path = prepare_variant(args.name, args.quant, force=args.force, n_threads=args.threads, pure=pure)
    print(f"{derived_name(args.name, args.quant, pure)}  {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Measure models side by side (size, perplexity, agreement, AR tok/s, v(k)); table or JSON."""
    import json

    from speclm.bench.analysis.model_compare import compare_models, print_table
    if len(args.models) < 2:
        raise ModelError("compare needs at least two models, e.g. `speclm models compare "
                         "qwen2.5-coder-1.5b qwen2.5-coder-1.5b@q4_0`")
    if args.texts < 0 or args.ar_tokens < 0:
        raise ModelError(f"--texts and --ar-tokens must be >= 0, got {args.texts} and {args.ar_tokens}")
    if args.n_threads is not None and args.n_threads < 1:
        raise ModelError(f"--threads must be >= 1, got {args.n_threads}")
    if not 1 <= args.k_max <= 64:
        raise ModelError(f"--k-max must be in [1, 64], got {args.k_max}")
    progress = None if args.quiet else (lambda msg: print(f"[compare] {msg}", file=sys.stderr, flush=True))
    result = compare_models(*args.models, texts=args.texts, n_threads=args.n_threads,
                            ks=range(1, args.k_max + 1), ar_tokens=args.ar_tokens,
                            quality=not args.no_quality, progress=progress)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def add_models_parser(subparsers: Any) -> None:
    """Register `models` (with list/path/verify/prepare/compare) on an argparse subparsers object."""
    models = subparsers.add_parser("models", help="list, locate, verify, requantise and compare GGUF models")
    sub = models.add_subparsers(dest="models_command", metavar="{list,path,verify,prepare,compare}")
    sub.required = True

    p_list = sub.add_parser("list", help="show registered models and their state")
    p_list.set_defaults(func=cmd_list)

    p_path = sub.add_parser("path", help="print the GGUF path of a model (assembling it if needed)")
    p_path.add_argument("name", help="registered model name or local .gguf path")
    p_path.set_defaults(func=cmd_path)

    p_verify = sub.add_parser("verify", help="full sha256 check of models (all if none named)")
    p_verify.add_argument("names", nargs="*", metavar="NAME",
                          help="registered model names or NAME@QUANT[-pure] variants")
    p_verify.add_argument("--repair", action="store_true",
                          help="delete and reassemble corrupt assembled models (rebuild corrupt variants)")
    p_verify.set_defaults(func=cmd_verify)

    from speclm.models.variants import PURE_SUFFIX, QUANTS
    p_prep = sub.add_parser("prepare", help="requantise a registered model into the cache as NAME@QUANT",
                            description="Requantise a registered model with llama.cpp (e.g. to q4_0, whose "
                                        "block forwards are cheap on CPUs) into the cache as NAME@QUANT "
                                        f"(NAME@QUANT{PURE_SUFFIX} with --pure). "
                                        "The result is a different model: output is lossless against it.")
    p_prep.add_argument("name", metavar="NAME", help="registered model name")
    p_prep.add_argument("--quant", required=True, metavar="TYPE", type=str.lower,
                        help=f"quantisation type: {', '.join(QUANTS)}")
    p_prep.add_argument("--pure", action="store_true",
                        help="quantise the output head and token embedding to TYPE too "
                             f"(named NAME@TYPE{PURE_SUFFIX}); cheaper block verification on CPUs")
    p_prep.add_argument("--force", action="store_true", help="rebuild even if the variant exists (repairs it)")
    p_prep.add_argument("--threads", type=int, default=None, help="quantizer threads (default: all cores)")
    p_prep.set_defaults(func=cmd_prepare)

    p_cmp = sub.add_parser("compare", help="compare models: size, perplexity, agreement, AR tok/s, v(k)",
                           description="Measure models side by side; greedy agreement is against the first.")
    p_cmp.add_argument("models", nargs="+", metavar="MODEL",
                       help="two or more registered names, NAME@QUANT variants or GGUF paths")
    p_cmp.add_argument("--texts", type=int, default=8, metavar="N",
                       help="HumanEval problems added to the perplexity text set (default 8)")
    add_options(p_cmp, LoadConfig, "models", skip=("target", "draft", "n_ctx"))
    p_cmp.add_argument("--k-max", type=int, default=16, help="largest block size timed (default 16)")
    p_cmp.add_argument("--ar-tokens", type=int, default=64, help="tokens per plain-decoding run (default 64)")
    p_cmp.add_argument("--no-quality", action="store_true",
                       help="skip perplexity and agreement (rerun timings on a quiet machine)")
    add_json_option(p_cmp)
    p_cmp.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p_cmp.set_defaults(func=cmd_compare)
