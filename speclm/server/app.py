"""The OpenAI-compatible HTTP app over one speclm Engine: `create_app(llm, config)`
(the routes and answers are http.py's; this is the one-process Frontend).

Contracts:
- One Engine (config.max_concurrency running, config.max_queue waiting) serves
  every request; generation runs in the engine thread, handlers only await it.
- Every error has OpenAI's body shape; bad input is a 4xx, never a 500.
  Queue full: 429; a request takes a queue place only once its body has arrived
  and parsed (the gate reads it first). Past config.request_timeout_s: the request is cancelled
  and answered 504 (streams: an error event, then `data: [DONE]`).
- With API keys set (config.api_key, config.api_keys), /v1/* and /admin/* need
  `Authorization: Bearer KEY` (401 otherwise). Each key is a tenant with its own
  suffix cache and adapted heads (tenants.py); config.share_cache shares one.
  POST /admin/cache/clear forgets the caller's; the operator's
  (config.operator_key) any tenant's. /metrics and /health's details are the
  operator's, or without an operator key loopback clients'; anyone gets
  /health's public view, up and ready (access.py).
- /v1/models names the model files by name and sha256, never by path
  (models/catalog.py:identify, looked up or hashed once, at start).
  Bodies over config.max_body_bytes: 413;
  a body not received within config.body_timeout_s: 408 (and the connection closes).
- Error messages escape what they echo (a lone surrogate renders as \\ud800).
- Backends are used under llm.backend_lock only (the engine thread holds it per
  round), so a request that calibrates a cost model never races a decode.
- /health and /metrics report the SSD speculator (alive / lost, restarts).
- A client that disconnects mid-stream has its request cancelled (its KV
  sequence is freed at the engine's next turn).
- Shutdown (lifespan end, or `app.state.speclm.close()`) cancels in-flight
  requests: streams end with an error event and [DONE], others get a 503.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI

from ..api import LLM
from ..backends.base import Backend
from ..constraints import warm as warm_grammars
from ..engine import Engine, RequestHandle
from ..errors import InvalidRequestError
from ..models.catalog import identify
from ..sampling import first_row_problem
from ..speculative.loop import context_problem
from ..speculative.methods import get_method, priced_proposals
from .config import ServerConfig
from .access import Access
from .http import http_app
from .prom import ServerMetrics
from .tenants import SHARED, Tenants
from .api_errors import ParamError, api_error, hide_path
from .schemas import _GenerationRequest
from .structured import compiled


class ServerState:
    """What the handlers share: the LLM, one Engine, the metrics."""

    def __init__(self, llm: LLM, config: ServerConfig):
        self.llm, self.config = llm, config
        try:
            self.draft: Backend | None = llm.draft  # loaded now: fail fast, and no lazy-load race
        except InvalidRequestError:  # no draft model configured
            self.draft = None
        self.spec = config.spec
        if get_method(self.spec.method).needs_draft(self.spec, has_draft=self.draft is not None) \
                and self.draft is None:
            raise InvalidRequestError(f"the default method {self.spec.method} needs a draft model (--draft)")
        for proposal in sorted(priced_proposals(self.spec, has_draft=self.draft is not None)):
            llm.measure_costs(proposal)  # now, while every KV sequence is free: a request never waits to time them
        self.model_id = config.model_id or Path(llm.target.name).stem
        self.engine = Engine(llm, config.max_concurrency, config.max_queue)
        self.tenants = Tenants(config.keys, config.share_cache)
        self.access = Access(self.tenants, config.operator_key)
        for backend in (llm.target, self.draft):  # messages name the model files, never their paths
            if backend is not None and backend.path is not None:
                for path in {str(backend.path), str(Path(backend.path).resolve()), str(backend.name)}:
                    hide_path(path, Path(backend.path).name)
        self.target_id = _identity(llm.target)
        self.draft_id = _identity(self.draft) if self.draft is not None else None
        self.metrics = ServerMetrics(lambda: self.engine.load, llm.speculator_state, llm.suffix_cache_stats,
                                     llm.prefix_cache_stats)
        self.created = int(time.time())
        # the grammar tokenizers and the compile worker, built while the server starts taking requests
        threading.Thread(target=warm_grammars, args=(llm.target,), name="speclm-grammar-warm", daemon=True).start()
        self.closing = False
        self._accounting: set[asyncio.Task] = set()

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "speclm",
                "speclm": {"target": self.target_id, "lossless_against": self.target_id, "draft": self.draft_id,
                           "default_speculative": {"method": self.spec.method, "k": self.spec.effective_k},
                           "n_ctx": self.llm.target.n_ctx, "max_tokens_limit": self.config.max_tokens_limit}}

    def submit(self, req: _GenerationRequest, tenant: str | None = None) -> RequestHandle:
        """Validate, tokenize and enqueue (blocking: run it in a worker thread);
        the request drafts from `tenant`'s cache scope."""
        req.unsupported()
        req.bind(self.llm)
        limit, asked, name = self.config.max_tokens_limit, req.requested_max_tokens(), req.max_tokens_param
        least = 0 if req.scores_only() else 1
        if asked is not None and not least <= asked <= limit:
            raise ParamError(f"{name} must be in [1, {limit}] (0 only to score the prompt: echo with logprobs), "
                             f"got {asked}", name)
        if req.stream and getattr(req, "echo", False):
            raise ParamError("echo is not supported with stream: true: send it unstreamed", "echo")
        spec = replace(req.spec(self.spec, has_draft=self.draft is not None),
                       cache_scope=self.tenants.scope_of(tenant))
        params = req.sampling(1)  # validate the sampling fields before paying for tokenization
        allowed = None if params.grammar is None else compiled(params.grammar, self.llm.target, req.grammar_param)
        vocab = self.llm.target.vocab_size
        if problem := first_row_problem(params, vocab, allowed, f"the {req.grammar_param} grammar"):
            raise ParamError(problem, "logit_bias")  # decided now: a 400, never a stop after the 200
        ids, n_ctx = req.prompt_ids(self.llm), self.llm.target.n_ctx
        if problem := context_problem(n_ctx, len(ids), asked, name):
            message, culprit = problem
            if culprit == "prompt":
                raise ParamError(f"{message}: shorten the prompt", req.prompt_param)
            raise ParamError(f"{message}: lower {name} or shorten the prompt", name)
        if asked is None:
            asked = min(req.default_max_tokens or limit, limit, n_ctx - len(ids))
        try:
            handle = self.engine.submit(ids, req.sampling(asked), spec, prediction=req.prediction_text())
        except InvalidRequestError as exc:
            raise req.naming(exc) from None
        if getattr(req, "echo", False):  # the prompt echoed before the completion: as sent, or its ids decoded
            handle.echo = req.echo_text()
            if handle.echo is None:
                handle.echo = b"".join(self.llm.target.token_bytes(t) for t in ids).decode("utf-8", "replace")
        return handle

    async def open(self, req: _GenerationRequest, tenant: str | None) -> RequestHandle:
        """Submit in a worker thread; bad input raises its APIError."""
        try:
            return await asyncio.to_thread(self.submit, req, tenant)
        except Exception as exc:
            raise api_error(exc) from exc

    def health_body(self, detailed: bool) -> dict:
        """/health's body: up (ok, or shutting_down) and ready (a request would be taken now),
        for anyone; `detailed` (for the operator): also the model, the load, the kernels
        and, once an ssd request has started it, the SSD speculator."""
        running, queued = self.engine.load
        room = running < self.config.max_concurrency or queued < self.config.max_queue
        body: dict = {"status": "shutting_down" if self.closing else "ok", "ready": room and not self.closing}
        if not detailed:
            return body
        body.update(model=self.model_id, running=running, queued=queued)
        kernels = self.llm.target.kernel_choice
        if kernels is not None:
            body["kernels"] = {"name": kernels.name, "reason": kernels.reason}
        speculator = self.llm.speculator_state()
        if speculator is not None:  # {"state": "alive" | "lost", "restarts", "pid", "reason"}
            body["speculator"] = speculator
        return body

    async def health(self, detailed: bool) -> dict:
        return self.health_body(detailed)

    async def clear_cache(self, scope: str | None) -> dict:
        return await asyncio.to_thread(self.forget, scope)

    async def render_metrics(self) -> tuple[bytes, str]:
        return self.metrics.render()

    def forget(self, scope: str | None) -> dict:
        """Forget what was kept for cache `scope` (a tenant's suffix cache, adapted heads,
        prompt KV copies, and the acceptance calibration and cost curves its requests
        learnt; None: the shared scope); returns what the caches held."""
        held = self.llm.suffix_cache_stats().get(scope, {})
        kv = self.llm.prefix_cache_stats().get(scope, {})
        self.llm.clear_suffix_cache(scope)
        self.llm.clear_heads(scope)
        self.llm.clear_prefix_cache(scope)
        self.llm.forget_learnt(scope)
        return {"object": "cache.cleared", "scope": SHARED if scope is None else scope,
                "suffix_cache": {"requests": held.get("cached_requests", 0),
                                 "tokens": held.get("cached_tokens", 0)},
                "prefix_cache": {"entries": kv.get("entries", 0), "tokens": kv.get("tokens", 0)}}

    def account(self, handle: RequestHandle) -> None:
        """Add the request's result to the metrics once it has one (call once per request)."""
        if handle.done:
            return self._observe(handle)
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._observe, handle, 60.0))
        self._accounting.add(task)
        task.add_done_callback(self._accounting.discard)

    def _observe(self, handle: RequestHandle, timeout: float = 0.0) -> None:
        try:
            self.metrics.observe_result(handle.result(timeout))
        except Exception:  # failed requests have no result; their status is counted
            pass

    async def close(self) -> None:
        """Refuse new requests and cancel those in flight (idempotent)."""
        self.closing = True
        await asyncio.to_thread(self.engine.shutdown, True)


def _identity(backend: Backend) -> dict:
    """{"name", "sha256"} of a backend's model file (in-memory backends: their name, no sha256)."""
    if backend.path is None:
        return {"name": backend.name, "sha256": None}
    name, sha = identify(backend.path)
    return {"name": name, "sha256": sha}


def create_app(llm: LLM, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving `llm` (http.py's routes); its state is `app.state.speclm` (ServerState)."""
    return http_app(ServerState(llm, config or ServerConfig()))
