"""The OpenAI-compatible HTTP app over one speclm Engine: `create_app(llm, config)`.

Contracts:
- One Engine (config.max_concurrency running, config.max_queue waiting) serves
  every request; generation runs in the engine thread, handlers only await it.
- Every error has OpenAI's body shape; bad input is a 4xx, never a 500.
  Queue full: 429. Past config.request_timeout_s: the request is cancelled
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
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from ..api import LLM
from ..backends.base import Backend
from ..engine import Engine, RequestHandle
from ..errors import InvalidRequestError
from ..metrics import GenerationResult
from ..models.catalog import identify
from ..speculative.loop import context_problem
from ..speculative.methods import get_method, priced_proposals
from .config import ServerConfig
from .access import Access
from .gate import Gate, caller_of, tenant_of
from .prom import RequestMetrics, ServerMetrics
from .tenants import SHARED, Tenants
from .schemas import (APIError, ChatCompletionRequest, CompletionRequest, ParamError, Usage, _GenerationRequest,
                      api_error, chunk_body, printable, quoted, response_body, validation_error)


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


class _EventStream(StreamingResponse):
    """SSE response that cancels its request however the response ends
    (a disconnect included), then accounts it."""

    def __init__(self, events: AsyncIterator[str], handle: RequestHandle, state: ServerState):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._handle, self._state = handle, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._handle.cancel()  # no-op when finished; frees the sequence on a disconnect
            self._state.account(self._handle)


async def _cancel_on_disconnect(request: Request, handle: RequestHandle) -> None:
    """Cancel `handle` if the client hangs up before its (non-streamed) answer."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


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
        self.target_id = _identity(llm.target)
        self.draft_id = _identity(self.draft) if self.draft is not None else None
        self.metrics = ServerMetrics(lambda: self.engine.load, llm.speculator_state, llm.suffix_cache_stats,
                                     llm.prefix_cache_stats)
        self.created = int(time.time())
        self.closing = False
        self._accounting: set[asyncio.Task] = set()

    def model_card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "speclm",
                "speclm": {"target": self.target_id, "lossless_against": self.target_id, "draft": self.draft_id,
                           "default_speculative": {"method": self.spec.method, "k": self.spec.effective_k},
                           "n_ctx": self.llm.target.n_ctx, "max_tokens_limit": self.config.max_tokens_limit}}

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            if printable(model) != model:
                raise APIError(400, f"model must be valid Unicode text, got {quoted(model)}: send the "
                               f"id `{self.model_id}`", param="model")
            raise APIError(404, f"The model {quoted(model)} does not exist: this server serves "
                           f"`{self.model_id}`", param="model", code="model_not_found")

    def submit(self, req: _GenerationRequest, tenant: str | None = None) -> RequestHandle:
        """Validate, tokenize and enqueue (blocking: run it in a worker thread);
        the request drafts from `tenant`'s cache scope."""
        req.unsupported()
        limit, asked, name = self.config.max_tokens_limit, req.requested_max_tokens(), req.max_tokens_param
        if asked is not None and not 1 <= asked <= limit:
            raise ParamError(f"{name} must be in [1, {limit}], got {asked}", name)
        spec = replace(req.spec(self.spec, has_draft=self.draft is not None),
                       cache_scope=self.tenants.scope_of(tenant))
        req.sampling(1)  # validate the sampling fields before paying for tokenization
        ids, n_ctx = req.prompt_ids(self.llm), self.llm.target.n_ctx
        if problem := context_problem(n_ctx, len(ids), asked, name):
            message, culprit = problem
            if culprit == "prompt":
                raise ParamError(f"{message}: shorten the prompt", req.prompt_param)
            raise ParamError(f"{message}: lower {name} or shorten the prompt", name)
        if asked is None:
            asked = min(req.default_max_tokens or limit, limit, n_ctx - len(ids))
        return self.engine.submit(ids, req.sampling(asked), spec)

    async def serve(self, req: _GenerationRequest, request: Request) -> Response:
        """Answer one completion request (JSON, or SSE when req.stream)."""
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        if self.closing:
            raise APIError(503, "the server is shutting down", "server_error", code="unavailable")
        self.check_model(req.model)
        try:
            handle = await asyncio.to_thread(self.submit, req, tenant_of(request))
        except Exception as exc:
            raise api_error(exc) from exc
        chat = isinstance(req, ChatCompletionRequest)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return _EventStream(self._events(handle, rid, chat, deadline, usage), handle, self)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, handle))
        try:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            result = await asyncio.to_thread(handle.result, left)
        except BaseException as exc:
            handle.cancel()
            raise self._timeout() if isinstance(exc, TimeoutError) else exc
        finally:
            watcher.cancel()
            self.account(handle)
        if result.finish_reason == "cancelled":
            raise self._cancelled()
        return JSONResponse(response_body(rid, self.model_id, result, chat))

    async def _events(self, handle: RequestHandle, rid: str, chat: bool, deadline: float,
                      include_usage: bool) -> AsyncIterator[str]:
        loop, created = asyncio.get_running_loop(), int(time.time())

        def chunk(**kw) -> str:
            return _sse(chunk_body(rid, self.model_id, created, chat, **kw))

        if chat:
            yield chunk(role=True)
        deltas = handle.astream()
        try:
            while True:
                try:
                    text = await asyncio.wait_for(deltas.__anext__(), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    break
                yield chunk(text=text)
            result: GenerationResult = handle.result(0)
            if result.finish_reason == "cancelled":
                yield _sse(self._cancelled().body)
            else:
                yield chunk(finish_reason=result.finish_reason)
                if include_usage:
                    yield chunk(usage=Usage.of(result))
        except Exception as exc:
            handle.cancel()
            yield _sse((self._timeout() if isinstance(exc, TimeoutError) else api_error(exc)).body)
        yield _sse("[DONE]")

    def health(self, detailed: bool) -> dict:
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

    def clear_cache(self, scope: str | None) -> dict:
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

    def _timeout(self) -> APIError:
        return APIError(504, f"the request did not finish within {self.config.request_timeout_s:g} s "
                        "and was cancelled", "timeout_error", code="request_timeout")

    def _cancelled(self) -> APIError:
        return APIError(503, "the request was cancelled: the server is shutting down", "server_error",
                        code="cancelled")

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
    """The FastAPI app serving `llm`; its state is `app.state.speclm` (ServerState)."""
    config = config or ServerConfig()
    state = ServerState(llm, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Each in-flight request parks one thread waiting on the engine (to_thread):
        # size the pool so waiting requests never queue behind each other.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            config.max_concurrency + config.max_queue + 8, thread_name_prefix="speclm-wait"))
        yield
        await state.close()

    app = FastAPI(title="speclm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.speclm = state
    app.add_middleware(Gate, access=state.access, max_body_bytes=config.max_body_bytes,
                       body_timeout_s=config.body_timeout_s)
    app.add_middleware(RequestMetrics, metrics=state.metrics)  # outermost: sees 401 and 413 too

    async def on_error(_request: Request, exc: Exception) -> Response:
        if isinstance(exc, RequestValidationError):
            return validation_error(exc.errors()).response()
        if isinstance(exc, StarletteHTTPException):
            type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
            return APIError(exc.status_code, str(exc.detail), type_).response(exc.headers)
        return api_error(exc).response()

    for kind in (APIError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, on_error)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await state.serve(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await state.serve(body, request)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [state.model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        state.check_model(model)
        return state.model_card()

    @app.post("/admin/cache/clear")
    async def clear_cache(request: Request, tenant: str | None = None) -> dict:
        scope = state.access.cache_scope(caller_of(request), tenant)
        return await asyncio.to_thread(state.clear_cache, scope)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        return JSONResponse(state.health(caller_of(request).observer), 503 if state.closing else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    return app
