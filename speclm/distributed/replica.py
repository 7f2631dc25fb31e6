"""One engine replica of a Ray Serve deployment: an LLM and its batching engine
behind the one-process server's own ServerState (server/app.py), so a request is
validated, tokenized, cached and accounted exactly as `speclm serve` does it.

Contracts:
- llama.cpp computes with the CPUs Ray assigned the replica (never os.cpu_count()).
- `generate` yields ("accepted", replica), then ("text", delta)*, then ("done",
  GenerationResult); or a single ("error", APIError) for a request it refuses.
  A caller that stops reading (a client gone) cancels the request.
- Every second the replica reports its health and metrics to the directory and
  does the cache-clearing orders it finds there.
- Ray Serve's hooks: `check_health` fails once the engine thread is gone; on
  shutdown Serve stops routing to the replica and waits for its requests
  (graceful_shutdown_timeout_s) before `__del__` closes the engine and the LLM.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from ..api import LLM
from ..server.app import ServerState
from ..server.api_errors import APIError, api_error
from ..server.schemas import _GenerationRequest
from .cpus import assigned_threads
from .directory import directory
from .settings import ReplicaSpec
from .speculator import locate_speculator

log = logging.getLogger("speclm.distributed")

REPORT_EVERY_S = 1.0


class EngineReplica:
    """Holds one LLM and one Engine; the ingress calls `generate` through a DeploymentHandle."""

    def __init__(self, spec: ReplicaSpec):
        ctx = serve.get_replica_context()
        self.name, self.actor = ctx.replica_id.unique_id, ctx.replica_id.to_full_id_str()
        self.node = ray.get_runtime_context().get_node_id()[:12]
        speculator = spec.speculator
        if speculator is not None and spec.ray.speculator_node:
            # Ray restarts the actor; the replica keeps finding it (backoff capped by max_backoff_s)
            speculator = dataclasses.replace(speculator, locate=locate_speculator, max_restarts=1 << 30)
        self.threads = assigned_threads()
        llm = LLM(**spec.llm, n_threads=self.threads, speculator=speculator)
        try:
            self.state = ServerState(llm, spec.server)
            llm.warmup(spec.spec)
        except BaseException:
            llm.close()
            raise
        self._stop = threading.Event()
        self._reporter = threading.Thread(target=self._report_loop, name="speclm-report", daemon=True)
        self._reporter.start()
        log.info("replica %s on node %s: %d llama.cpp threads", self.name, self.node, self.threads)

    async def generate(self, req: _GenerationRequest, tenant: str | None) -> AsyncIterator[tuple[str, Any]]:
        try:
            handle = await self.state.open(req, tenant)
        except APIError as exc:
            yield "error", exc
            return
        yield "accepted", self.name
        if getattr(handle, "echo", None) is not None:  # echo: true: the prompt's text (app.ServerState.submit)
            yield "echo", handle.echo
        # the ingress reads calls from the text (it has no vocabulary): the tag tokens are spelled as text here
        calls = req.call_spec()
        spelled = calls.tags.shown if calls is not None else str
        try:
            async for text in handle.astream():
                yield "text", spelled(text)
            result = await handle.aresult()
            yield "done", dataclasses.replace(result, text=spelled(result.text))
        except Exception as exc:  # noqa: BLE001 - becomes the client's error event
            yield "error", api_error(exc)
        finally:
            handle.cancel()  # no-op when finished; frees the sequence when the caller went away
            self.state.account(handle)

    def card(self) -> dict:
        return self.state.model_card()

    def check_health(self) -> None:
        """Ray Serve's health check: the replica is replaced if this raises."""
        if not self.state.engine.alive:
            raise RuntimeError("the engine thread has stopped")

    def _report_loop(self) -> None:
        book = directory()
        while not self._stop.wait(REPORT_EVERY_S):
            try:
                health = {**self.state.health_body(True), "node": self.node, "actor": self.actor,
                          "threads": self.threads}
                orders = ray.get(book.report.remote(self.name, health, self.state.metrics.render()[0]), timeout=5)
                for order, scope in orders:
                    book.done.remote(order, self.name, self.state.forget(scope))
            except Exception as exc:  # noqa: BLE001 - the directory restarting: report again next second
                log.warning("replica %s could not report: %s", self.name, exc)

    def __del__(self) -> None:
        self._stop.set()
        self.state.closing = True
        self.state.engine.shutdown(True)
        self.state.llm.close()
