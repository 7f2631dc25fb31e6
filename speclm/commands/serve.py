"""`speclm serve`: run the OpenAI-compatible server.

Safe by default: binds 127.0.0.1 unless --host is given; the SPECLM_API_KEY
environment variable (or --api-key, which every local user can read in `ps`)
makes /v1/* and /admin/* require `Authorization: Bearer KEY`; /metrics and
/health's details need SPECLM_OPERATOR_KEY (--operator-key), or without one come
from loopback (server/access.py). Several
keys (comma-separated, or --api-key repeated) are several tenants, each with
its own suffix cache and prompt KV cache unless --share-suffix-cache. Slow clients are
bounded: request headers must arrive within --header-timeout and a body within
--body-timeout (408), idle keep-alive connections close after --keep-alive-timeout,
one address opens at most --max-connections-per-client connections (429), and beyond
--max-connections every route but /health answers 503. Ctrl-C / SIGTERM cancels in-flight requests (streams end
with an error event and [DONE]), closes the LLM (the SSD speculator and its
temporary socket directory included) and exits (SIGTERM: status 143).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from ..api import LLM
from ..backends.load import LoadConfig
from ..errors import InvalidRequestError
from ..speculative.methods import get_method
from ..server.app import create_app
from ..server.config import ListenConfig, ServerConfig
from ..server.connections import guarded_protocol
from ..distributed.settings import RaySettings, ReplicaSpec
from ..speculative.config import SpecConfig
from .flags import add_options, add_spec_options, build, llm_arguments, spec_from_args


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_parser(subparsers) -> None:
    """Register `serve` on an argparse subparsers object (func=cmd_serve)."""
    s = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                              description="Serve /v1/completions, /v1/chat/completions, /v1/models, "
                                          "/health and /metrics over one speculative engine.")
    add_options(s, LoadConfig, "models")
    add_options(s, ServerConfig, "server")
    add_options(s, ListenConfig, "listening")
    add_spec_options(s)  # the defaults for requests that do not set `speculative`
    ray = s.add_argument_group("ray serve (docs/distributed.md)")
    ray.add_argument("--ray", action="store_true", help="serve on Ray Serve: an ingress and --replicas engine "
                     "replicas on a local cluster, or the one at --ray-address")
    add_options(ray, RaySettings)
    s.set_defaults(func=cmd_serve)


def _model_id(load: LoadConfig, config: ServerConfig) -> str:
    from ..models.registry import DEFAULT_TARGET
    if config.model_id:
        return config.model_id
    if load.target is None:
        return DEFAULT_TARGET
    return Path(load.target).stem if load.target.endswith(".gguf") else load.target


def server_settings(args: argparse.Namespace) -> tuple[SpecConfig, ServerConfig, dict]:
    """The default speculation, the server's config and LLM's arguments the flags describe."""
    spec = spec_from_args(args)
    method = get_method(spec.method)
    if unused := spec.unused_settings(method.proposal_for(spec, has_draft=True)):
        raise InvalidRequestError(f"{', '.join(o.flag for o in unused)} not read by the default method "
                                  f"{spec.method}: drop {'it' if len(unused) == 1 else 'them'} or choose a method "
                                  "that reads them")
    config = build(args, ServerConfig, default_spec=spec).with_env_keys()
    config = dataclasses.replace(config, model_id=_model_id(build(args, LoadConfig), config))
    arguments = llm_arguments(args, spec, max_sequences=config.max_concurrency,
                              prefix_cache_tokens=config.prefix_cache_tokens,
                              suffix_cache_tokens=config.suffix_cache_tokens)
    if config.max_concurrency > 1:  # kernels for the requests it serves together, not for one stream
        arguments["kernels_for"] = "serving"
    return spec, config, arguments


def build_app(args: argparse.Namespace) -> tuple[LLM, FastAPI]:
    """Load the models (and warm them up) and build the app; the caller closes the LLM."""
    spec, config, arguments = server_settings(args)
    llm = LLM(**arguments)
    try:
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


def uvicorn_config(app: FastAPI, args: argparse.Namespace) -> uvicorn.Config:
    """uvicorn's settings from the serve flags: the h11 protocol under the connection
    bounds (connections.py; not uvicorn's limit_concurrency, which would refuse /health
    too) and the keep-alive timeout."""
    listen = build(args, ListenConfig)
    return uvicorn.Config(app, host=listen.host, port=listen.port, log_level=listen.log_level,
                          http=guarded_protocol(listen.connection_limits(build(args, ServerConfig))),
                          timeout_keep_alive=listen.keep_alive_timeout)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through cmd_serve's `finally`, unlike SIGTERM's default


def ray_spec(args: argparse.Namespace) -> ReplicaSpec:
    """What each Ray Serve engine replica loads and serves, from `speclm serve`'s flags."""
    spec, config, arguments = server_settings(args)
    arguments.pop("n_threads")  # a replica computes with the CPUs Ray gives it
    speculator = arguments.pop("speculator")
    return ReplicaSpec(arguments, config, spec, speculator, build(args, RaySettings))


def ray_app(args: dict):
    """The Ray Serve application for `serve run` / `serve deploy` / KubeRay's RayService:
    `args: {flags: "..."}` holds `speclm serve`'s flags (e.g. "--target smollm2-135m --replicas 3");
    API keys come from SPECLM_API_KEY / SPECLM_OPERATOR_KEY in the environment."""
    import shlex

    from . import build_parser
    from ..distributed.deploy import application
    parsed = build_parser().parse_args(["serve", *shlex.split(str(args.get("flags", "")))])
    return application(ray_spec(parsed))


def _serve_on_ray(args: argparse.Namespace) -> int:
    try:
        from ..distributed.deploy import run
    except ImportError as exc:
        raise InvalidRequestError(f"--ray needs Ray Serve ({exc}): pip install 'speclm[ray]'") from None
    listen = build(args, ListenConfig)
    spec = ray_spec(args)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        run(spec, host=listen.host, port=listen.port)  # until Ctrl-C or SIGTERM; then the app is taken down
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the LLM and app, serve until interrupted; 0 on a clean exit.

    uvicorn re-raises the SIGTERM it shut down on; with the default handler the
    process would die there, before llm.close(). SystemExit instead lets the
    LLM close: the speculator stops and its temporary directory is removed."""
    build(args, ListenConfig)  # bad flags fail before the models load
    if args.ray:
        return _serve_on_ray(args)
    for flag, given, env in (("--api-key", args.api_keys, "SPECLM_API_KEY"),
                             ("--operator-key", args.operator_key, "SPECLM_OPERATOR_KEY")):
        if given:
            print(f"speclm: warning: {flag} is visible to every local user (ps, /proc): set {env} "
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
