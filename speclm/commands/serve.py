"""`speclm serve`: run the OpenAI-compatible server.

Safe by default: binds 127.0.0.1 unless --host is given; the SPECLM_API_KEY
environment variable (or --api-key, which every local user can read in `ps`)
makes /v1/*, /admin/* and /metrics require `Authorization: Bearer KEY`. Several
keys (comma-separated, or --api-key repeated) are several tenants, each with
its own suffix cache and prompt KV cache unless --share-suffix-cache. Slow clients are
bounded: a body must arrive within --body-timeout (408), idle keep-alive
connections close after --keep-alive-timeout, and beyond --max-connections
uvicorn answers 503. Ctrl-C / SIGTERM cancels in-flight requests (streams end
with an error event and [DONE]), closes the LLM (the SSD speculator and its
temporary socket directory included) and exits (SIGTERM: status 143).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ..api import LLM
from ..errors import InvalidRequestError
from ..prefix_cache import PREFIX_CACHE_TOKENS
from .options import add_kernels_option, add_spec_options, draft_for, kernels_for, spec_from_args, speculator_config
from ..server.app import ServerConfig, create_app
from ..server.tenants import split_keys


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
    s.add_argument("--api-key", action="append", default=None, help="require `Authorization: Bearer KEY`; "
                   "repeat it for several tenants (each key drafts only from its own outputs); prefer "
                   "SPECLM_API_KEY=KEY[,KEY...] in the environment: a flag is visible to every local user in "
                   "`ps` (default: $SPECLM_API_KEY, else none)")
    s.add_argument("--share-suffix-cache", action="store_true", help="let every API key draft from one "
                   "suffix cache and reuse one prompt KV cache (faster for related tenants, but acceptance "
                   "timing and time to first token then leak one tenant's outputs and prompts to another)")
    s.add_argument("--max-concurrency", type=int, default=4, help="requests generating at once")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond that (then 429)")
    s.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens accepted")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit (413 beyond)")
    s.add_argument("--request-timeout", type=float, default=300.0, help="seconds before a request is "
                   "cancelled (504)")
    s.add_argument("--body-timeout", type=float, default=30.0, help="seconds a client has to send its "
                   "request body (408 beyond, and the connection closes)")
    s.add_argument("--max-connections", type=int, default=None, help="open connections at most; uvicorn "
                   "answers 503 beyond (default: max-concurrency + max-queue + 32)")
    s.add_argument("--keep-alive-timeout", type=float, default=5.0, help="seconds an idle keep-alive "
                   "connection stays open")
    s.add_argument("--model-id", default=None, help="the id clients pass as `model` "
                   "(default: the target's name)")
    s.add_argument("--n-ctx", type=int, default=4096, help="context length per sequence")
    s.add_argument("--prefix-cache-tokens", type=int, default=PREFIX_CACHE_TOKENS, metavar="N",
                   help="keep finished requests' KV (prompt and output, host memory) up to N tokens in all, "
                   "so a prompt that starts like an earlier one of the same API key prefills only the rest "
                   f"(default {PREFIX_CACHE_TOKENS}, ~28 KB a token on the default target; 0: off)")
    s.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    add_kernels_option(s)
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
              max_sequences=args.max_concurrency, speculator=speculator_config(args),
              prefix_cache_tokens=args.prefix_cache_tokens, kernels=args.kernels, kernels_for=kernels_for(spec))
    try:
        config = ServerConfig(
            model_id=_model_id(args), max_tokens_limit=args.max_tokens_limit,
            max_concurrency=args.max_concurrency, max_queue=args.max_queue,
            api_keys=tuple(args.api_key or split_keys(os.environ.get("SPECLM_API_KEY"))),
            share_cache=args.share_suffix_cache,
            max_body_bytes=args.max_body_bytes, request_timeout_s=args.request_timeout, default_spec=spec,
            body_timeout_s=args.body_timeout)
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


def _connection_cap(args: argparse.Namespace) -> int:
    if args.max_connections is not None and args.max_connections < 1 or not args.keep_alive_timeout > 0:
        raise InvalidRequestError("--max-connections must be >= 1 and --keep-alive-timeout > 0")
    return args.max_connections or args.max_concurrency + args.max_queue + 32


def uvicorn_config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    """uvicorn's settings from the serve flags (the connection cap and keep-alive timeout)."""
    return uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                          limit_concurrency=_connection_cap(args), timeout_keep_alive=args.keep_alive_timeout)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through cmd_serve's `finally`, unlike SIGTERM's default


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the LLM and app, serve until interrupted; 0 on a clean exit.

    uvicorn re-raises the SIGTERM it shut down on; with the default handler the
    process would die there, before llm.close(). SystemExit instead lets the
    LLM close: the speculator stops and its temporary directory is removed."""
    _connection_cap(args)  # bad flags fail before the models load
    if args.api_key:
        print("speclm: warning: --api-key is visible to every local user (ps, /proc): set SPECLM_API_KEY "
              "in the environment instead", file=sys.stderr)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        llm, app = build_app(args)
        try:
            if args.host not in _LOOPBACK and not app.state.speclm.config.keys:
                print(f"speclm: warning: serving on {args.host} without an API key: anyone who can reach "
                      "this port can use the model (SPECLM_API_KEY)", file=sys.stderr)
            Server(uvicorn_config(app, args)).run()
        finally:
            llm.close()
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
