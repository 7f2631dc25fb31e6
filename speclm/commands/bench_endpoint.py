"""The --endpoint flags of `speclm bench` and the command that runs them (bench/endpoint/).

A failure (unreachable URL, refused key, a server that is not OpenAI-compatible,
a timeout) ends the run with one line, `speclm: error: ...` (exit 1), after
writing what was measured so far: requests.jsonl (streamed), summary.json
("partial": true, "error"), manifest.json and report.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..bench.endpoint.bench import Endpoint, bench_endpoints
from ..bench.endpoint.client import base_url
from ..bench.output.sections import print_sections
from ..errors import InvalidRequestError
from ..server.tenants import split_keys

NOT_WITH_ENDPOINT = {"target": "--target", "targets": "--targets", "draft": "--draft", "drafts": "--drafts",
                     "methods": "--methods", "ks": "--k", "variant_quality": "--variant-quality",
                     "concurrency_repeats": "--concurrency-repeats", "prefix_cache_tokens": "--prefix-cache-tokens"}


def add_endpoint_options(b: argparse.ArgumentParser) -> None:
    e = b.add_argument_group("servers (--endpoint: the same prompts against OpenAI-compatible servers)")
    e.add_argument("--endpoint", default=None, metavar="URL",
                   help="benchmark the server at URL (e.g. http://127.0.0.1:8000) instead of local models")
    e.add_argument("--endpoint-b", default=None, metavar="URL",
                   help="a second server, compared with the first: B vs A per category, output identity at T=0")
    e.add_argument("--endpoint-api-key", default=None, metavar="KEY[,KEY...]",
                   help="bearer key for the servers (default $SPECLM_API_KEY; a flag is visible in `ps`); several, "
                        "comma-separated, are as many tenants: each category's prompts go with one key (the i-th "
                        "category with key i mod keys)")
    e.add_argument("--endpoint-api-key-b", default=None, metavar="KEY[,KEY...]",
                   help="keys for --endpoint-b (default: --endpoint-api-key)")
    e.add_argument("--endpoint-operator-key", default=None, metavar="KEY",
                   help="key /metrics is read with (a speclm server's operator key; default "
                        "$SPECLM_OPERATOR_KEY, else the API key): without it a remote speclm server's "
                        "speculation figures are missing")
    e.add_argument("--endpoint-model", default=None, metavar="ID",
                   help="model id to request from A (default: the first one its /v1/models lists)")
    e.add_argument("--endpoint-model-b", default=None, metavar="ID", help="model id for B (default: its first)")
    e.add_argument("--endpoint-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="cut off any one request to a server after SECONDS (default 120)")


def check_endpoint_args(args: argparse.Namespace) -> None:
    """Refuse flags that do not apply to servers, before anything is sent."""
    if not args.endpoint:
        raise InvalidRequestError("--endpoint-b needs --endpoint URL (the server B is compared with)")
    given = [flag for name, flag in NOT_WITH_ENDPOINT.items() if getattr(args, name, None)]
    if given:
        raise InvalidRequestError(f"{', '.join(given)} do not apply with --endpoint (the servers decide what "
                                  "runs and how): drop them")
    if not args.endpoint_timeout > 0:
        raise InvalidRequestError(f"--endpoint-timeout must be > 0, got {args.endpoint_timeout}")
    for url in filter(None, (args.endpoint, args.endpoint_b)):
        base_url(url)  # a malformed URL fails before anything is sent


def cmd_endpoint_bench(args: argparse.Namespace, v: dict, prompts: list) -> int:
    """`speclm bench --endpoint URL [--endpoint-b URL]`: `v` the resolved flags
    (commands/bench.resolve_args), `prompts` the prompt set they select."""
    keys_a = tuple(split_keys(args.endpoint_api_key or os.environ.get("SPECLM_API_KEY")))
    operator = args.endpoint_operator_key or os.environ.get("SPECLM_OPERATOR_KEY") or None
    servers = [Endpoint("A", args.endpoint, keys_a, args.endpoint_model, operator)]
    if args.endpoint_b:
        keys_b = tuple(split_keys(args.endpoint_api_key_b)) or keys_a
        servers.append(Endpoint("B", args.endpoint_b, keys_b, args.endpoint_model_b, operator))
    out_dir = Path(args.out or Path("bench-out") / time.strftime("%Y%m%d-%H%M%S"))
    out = bench_endpoints(servers, prompts, v["config"], out_dir, timeout=args.endpoint_timeout, dataset=args.dataset)
    print_sections(out["sections"])
    print(f"report: {out['report']}")
    return 0
