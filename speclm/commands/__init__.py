"""`speclm` command line: generate | models | serve | bench | heads | doctor.

Every user-fixable error is printed as one line `speclm: error: ...` and the
command exits 1 (2 for usage errors, as argparse does).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import SpeclmError


def _add_speculator(sub) -> None:
    # Listed for --help; main() hands its arguments to the worker's own parser.
    sub.add_parser("speculator", help="run an SSD speculator process (for --speculator-addr)")


def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .generate import add_generate_parser
    from .doctor import add_doctor_parser
    from .heads import add_heads_parser
    from .models import add_models_parser
    from .serve import add_serve_parser
    parser = argparse.ArgumentParser(prog="speclm", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    _add_speculator(sub)
    add_models_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_heads_parser(sub)
    add_doctor_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["speculator"]:
        from ..speculative.ssd.worker import main as speculator_main
        return speculator_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpeclmError as exc:
        print(f"speclm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("speclm: interrupted", file=sys.stderr)
        return 130

