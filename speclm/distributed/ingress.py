"""The ingress of a Ray Serve deployment: the one-process server's routes, gate,
errors and answers (server/http.py) over engine replicas reached through a
DeploymentHandle, with the routing key that keeps a tenant on its replica.

Contracts:
- Same API, schemas, errors and auth as `speclm serve` (the same code).
- A request whose replica fails before any of its text reached the client (a
  non-streamed request: before it finished) is sent again (same request: a
  seeded or greedy one gives the same text), up to settings.retries times; after
  that, or once text was streamed, the client gets a clean error (streams: an
  error event and [DONE]), never a hang.
- Every answer says which replica generated it (header X-Speclm-Replica).
- /health lists each replica's state (the directory's reports); /metrics joins
  every replica's exposition and the ingress's own, labelled by replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from ray import serve

from ..metrics import GenerationResult
from ..server.access import Access
from ..server.http import http_app
from ..server.prom import ServerMetrics, merge_expositions
from ..server.api_errors import APIError
from ..server.schemas import _GenerationRequest
from ..server.tenants import SHARED, Tenants
from .directory import directory
from .routing import routing_key
from .settings import ReplicaSpec

log = logging.getLogger("speclm.distributed")

RETRY_BACKOFF_S = 0.5


class RemoteHandle:
    """A request a replica generates, as http.py's Handle: `start()` returns once a
    replica accepted it (or raises its APIError); deltas and the result follow."""

    def __init__(self, call: Callable[[], Any], retries: int):
        self._call, self._retries = call, retries
        self._items: list[str] = []
        self._changed = asyncio.Event()
        self._finished = asyncio.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self.served_by: str | None = None
        self.echo: str | None = None  # echo: true: the prompt's text, as the replica read it
        self.attempts = 0
        self.delivered = False  # whether text reached the client (a stream's reader): then no retry

    async def start(self) -> None:
        accepted = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._pump(accepted))
        await accepted

    async def _pump(self, accepted: asyncio.Future) -> None:
        while True:
            self.attempts += 1
            stream = self._call()
            try:
                async for kind, value in stream:
                    if kind == "accepted":
                        self.served_by = value
                        if not accepted.done():
                            accepted.set_result(None)
                    elif kind == "echo":
                        self.echo = value
                    elif kind == "text":
                        self._items.append(value)
                        self._signal()
                    elif kind == "done":
                        return self._finish(result=value)
                    else:  # "error": the replica refused or failed the request itself
                        if not accepted.done():
                            accepted.set_exception(value)
                        return self._finish(error=value)
                raise RuntimeError("the replica's stream ended without a result")
            except asyncio.CancelledError:
                stream.cancel()
                self._finish(error=APIError(499, "the request was cancelled", code="cancelled"))
                raise
            except Exception as exc:  # noqa: BLE001 - the replica died or became unreachable
                if not self.delivered and self.attempts <= self._retries:
                    log.warning("replica %s failed before any text reached the client (%s): retrying on another",
                                self.served_by or "?", type(exc).__name__)
                    self._items = []  # the retry generates the same text again (greedy, or the same seed)
                    await asyncio.sleep(RETRY_BACKOFF_S * self.attempts)
                    continue
                error = APIError(502, f"replica {self.served_by or '?'} failed"
                                 f"{' after text reached the client' if self.delivered else ''} "
                                 f"({type(exc).__name__}; {self.attempts} attempt(s)): retry the request",
                                 "server_error", code="replica_failed")
                if not accepted.done():
                    accepted.set_exception(error)
                return self._finish(error=error)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _finish(self, result: GenerationResult | None = None, error: BaseException | None = None) -> None:
        if not self._finished.is_set():
            self._result, self._error = result, error
            self._finished.set()
            self._signal()

    async def astream(self) -> AsyncIterator[str]:
        seen = 0
        while True:
            changed = self._changed
            new, finished = self._items[seen:], self._finished.is_set()
            seen += len(new)
            for item in new:
                self.delivered = True
                yield item
            if finished:
                break
            await changed.wait()
        if self._error is not None:
            raise self._error

    async def aresult(self) -> GenerationResult:
        await self._finished.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    @property
    def done(self) -> bool:
        return self._finished.is_set()


class RayFrontend:
    """http.py's Frontend over the engine deployment (replicas answer, the ingress routes)."""

    def __init__(self, engines: Any, spec: ReplicaSpec):
        self.config, self.settings, self.engines = spec.server, spec.ray, engines
        self.tenants = Tenants(self.config.keys, self.config.share_cache)
        self.access = Access(self.tenants, self.config.operator_key)
        self.metrics = ServerMetrics(None)  # the HTTP counters; generation metrics are the replicas'
        self.book = directory()
        self.card: dict = {}
        self.model_id = self.config.model_id or ""
        self.closing = False

    async def load_card(self) -> None:
        self.card = await self.engines.card.remote()
        self.model_id = self.card["id"]

    def model_card(self) -> dict:
        return self.card

    async def open(self, req: _GenerationRequest, tenant: str | None) -> RemoteHandle:
        key = routing_key(req, self.tenants.scope_of(tenant))
        engines = self.engines.options(stream=True, session_id=key)
        handle = RemoteHandle(lambda: engines.generate.remote(req, tenant), self.settings.retries)
        await handle.start()
        return handle

    def account(self, handle: RemoteHandle) -> None:
        pass  # each replica accounts the requests it generated

    async def health(self, detailed: bool) -> dict:
        replicas = await self.book.replicas.remote()
        ready = any(r["state"] == "running" and r.get("ready") for r in replicas)
        body: dict = {"status": "shutting_down" if self.closing else "ok", "ready": ready and not self.closing}
        if detailed:
            body.update(model=self.model_id, routing=self.settings.routing, replicas=replicas)
        return body

    async def clear_cache(self, scope: str | None) -> dict:
        done = await self.book.clear.remote(scope)
        total = {"suffix_cache": {"requests": 0, "tokens": 0}, "prefix_cache": {"entries": 0, "tokens": 0}}
        for held in done.values():
            for cache, counts in total.items():
                for field in counts:
                    counts[field] += held[cache][field]
        return {"object": "cache.cleared", "scope": SHARED if scope is None else scope, **total,
                "replicas": sorted(done)}

    async def render_metrics(self) -> tuple[bytes, str]:
        parts = await self.book.metrics.remote()
        return merge_expositions({**parts, "ingress": self.metrics.render()[0]}), CONTENT_TYPE_LATEST

    async def close(self) -> None:
        self.closing = True


@serve.ingress()
class Ingress:
    """The HTTP entry deployment: http.py's app over a RayFrontend."""

    async def __init__(self, engines: Any, spec: ReplicaSpec):
        self.front = RayFrontend(engines, spec)
        await self.front.load_card()

    def __serve_build_asgi_app__(self):
        return http_app(self.front)
