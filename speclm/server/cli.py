"""`speclm serve`: run the OpenAI-compatible server.

Safe by default: binds 127.0.0.1 unless --host is given; --api-key (or the
SPECLM_API_KEY environment variable) makes /v1/* and /metrics require
`Authorization: Bearer KEY`. Ctrl-C / SIGTERM cancels in-flight requests
(streams end with an error event and [DONE]) and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ..api import LLM
from ..cli_options import add_spec_options, draft_for, spec_from_args, speculator_config
from .app import ServerConfig, create_app


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_parser(subparsers) -> None:
    """Register `serve` on an argparse subparsers object (func=cmd_serve)."""
    s = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                              description="Serve /v1/completions, /v1/chat/completions, /v1/models, "
                                          "/health and /metrics over one speculative engine.")
    s.add_argument("--target", default=None, help="target model: registered name or GGUF path "
                   "(default: qwen2.5-coder-1.5b)")
    s.add_argument("--draft", default=None, help="draft model for sd-draft: name or GGUF path "
                   "(default: qwen2.5-coder-0.5b when the target is the default)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` "
                   "(default: $SPECLM_API_KEY, else none)")
    s.add_argument("--max-concurrency", type=int, default=4, help="requests generating at once")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond that (then 429)")
    s.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens accepted")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit (413 beyond)")
    s.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a request is "
                   "cancelled (504)")
    s.add_argument("--model-id", default=None, help="the id clients pass as `model` "
                   "(default: the target's name)")
    s.add_argument("--n-ctx", type=int, default=4096, help="context length per sequence")
    s.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    add_spec_options(s)  # the defaults for requests that do not set `speculative`
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.set_defaults(func=cmd_serve)


def _model_id(args: argparse.Namespace) -> str:
    from ..models.registry import DEFAULT_TARGET
    if args.model_id:
        return args.model_id
    if args.target is None:
        return DEFAULT_TARGET
    return Path(args.target).stem if args.target.endswith(".gguf") else args.target


def build_app(args: argparse.Namespace) -> tuple[LLM, FastAPI]:
    """Load the models (and warm them up) and build the app; the caller closes the LLM."""
    spec = spec_from_args(args)
    llm = LLM(target=args.target, draft=draft_for(args, spec), n_ctx=args.n_ctx, n_threads=args.threads,
              max_sequences=args.max_concurrency, speculator=speculator_config(args))
    try:
        config = ServerConfig(
            model_id=_model_id(args), max_tokens_limit=args.max_tokens_limit,
            max_concurrency=args.max_concurrency, max_queue=args.max_queue,
            api_key=args.api_key or os.environ.get("SPECLM_API_KEY") or None,
            max_body_bytes=args.max_body_bytes, request_timeout_s=args.request_timeout, default_spec=spec)
        app = create_app(llm, config)
        llm.warmup(spec)
        return llm, app
    except BaseException:
        llm.close()
        raise


class Server(uvicorn.Server):
    """uvicorn.Server that cancels in-flight requests as soon as shutdown
    starts, instead of holding the shutdown until every stream has finished."""

    async def shutdown(self, sockets=None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "speclm", None)
        if state is not None:
            await state.close()
        await super().shutdown(sockets)


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the LLM and app, serve until interrupted; 0 on a clean exit."""
    llm, app = build_app(args)
    try:
        if args.host not in _LOOPBACK and not app.state.speclm.config.api_key:
            print(f"speclm: warning: serving on {args.host} without an API key: anyone who can reach "
                  "this port can use the model (--api-key or SPECLM_API_KEY)", file=sys.stderr)
        Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)).run()
    finally:
        llm.close()
    return 0
