"""The command line the client scripts (scripts/clients_*.py) share: the server's base URL,
the served model id, and a file to append each request body to."""

from __future__ import annotations

import argparse
from typing import IO


def parse(doc: str) -> tuple[argparse.Namespace, IO[str] | None]:
    """The parsed arguments and the open --log file (None without --log)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--log", help="append each request body (JSON) to this file")
    args = ap.parse_args()
    return args, (open(args.log, "a", buffering=1) if args.log else None)
