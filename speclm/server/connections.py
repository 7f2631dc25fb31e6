"""The HTTP server's own bounds on connections (docs/server.md#limits-cancellation-and-shutdown):
uvicorn's h11 protocol, with

- a header timeout: a connection has `header_timeout_s` to deliver a complete
  request head, counted from when it opens and again from the end of each
  request (a kept-alive connection's next head). Past it the connection is
  answered 408 (if it sent part of a head) and closed. uvicorn has no such bound:
  a client that sends nothing, or a byte at a time, holds its connection forever.
- a per-address cap: a new connection from an address (an IPv6 /64, peers.py)
  that already holds `per_client` open ones is answered 429 with Retry-After and
  closed before anything is read (0: no cap).
- a connection budget that spares /health: beyond `max_open` open connections
  (or as many requests in flight) every route but /health is answered 503 and the
  connection closes. uvicorn's limit_concurrency answers 503 to /health too, so
  a server using this protocol does not set it.

Contracts: one class per server (`guarded_protocol`), which holds that server's
per-address counts; a connection is counted from connection_made to
connection_lost, a refused one never. Passing the class as uvicorn.Config(http=...)
selects h11 whatever else is installed (httptools is never used). It upgrades no
WebSocket: the app serves none, and an upgraded connection would leave the counts.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import ClassVar

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .peers import client_key
from .api_errors import RETRY_AFTER_S, APIError, error_body


@dataclass(frozen=True)
class ConnectionLimits:
    """What `guarded_protocol` enforces (ListenConfig.connection_limits builds it)."""

    header_timeout_s: float  # to receive a request head, from connect or from the previous request's end
    per_client: int  # open connections per client address (0: no cap)
    max_open: int  # open connections (and requests in flight) served; beyond, 503 but /health
    exempt: tuple[str, ...] = ("/health",)  # paths served beyond max_open


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class for uvicorn.Config(http=...) that enforces `limits`, with
    its own per-address counts (make one per server)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "peers": Counter()})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol under ConnectionLimits (use `guarded_protocol`)."""

    limits: ClassVar[ConnectionLimits]
    peers: ClassVar[Counter[str]]  # client key -> open connections

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # uvicorn's cap would refuse /health too: _admit replaces it
        self.ws_protocol_class = None
        self._app, self.app = self.app, self._admit
        self._head_timer: asyncio.TimerHandle | None = None
        self._peer: str | None = None  # the key this connection is counted under

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        key = client_key(self.client[0]) if self.client else None  # None: a Unix socket
        if key is not None and self.limits.per_client and self.peers[key] >= self.limits.per_client:
            self.connections.discard(self)  # never counted against the budget
            self._answer_and_close(429, f"this address already has {self.limits.per_client} open connections "
                                   "(--max-connections-per-client): reuse them, or retry after closing some",
                                   "rate_limit_error", "too_many_connections", {"Retry-After": str(RETRY_AFTER_S)})
            return
        if key is not None:
            self.peers[key] += 1
            self._peer = key
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._peer is not None:
            self.peers[self._peer] -= 1
            if not self.peers[self._peer]:
                del self.peers[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    # ---- the header timeout -------------------------------------------------------
    def _watch_head(self) -> None:
        """Run the head timer while the connection waits for a request head
        (h11's client state IDLE), from the moment it starts waiting; stop it once one arrived."""
        waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
        if waiting and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_late)
        elif not waiting:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.trailing_data[0]:  # part of a head came: say why the connection closes
            self._answer_and_close(408, f"the request headers did not arrive within {self.limits.header_timeout_s:g} "
                                   "s (--header-timeout): send them at once", "invalid_request_error",
                                   "request_timeout", {})
        else:  # an idle connection closes silently, as at the keep-alive timeout
            self.transport.close()

    def _answer_and_close(self, status: int, message: str, type_: str, code: str, headers: dict[str, str]) -> None:
        body = json.dumps(error_body(message, type_, code=code)).encode()
        head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
                f"content-length: {len(body)}", "connection: close", *(f"{k}: {v}" for k, v in headers.items())]
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.transport.close()

    # ---- the connection budget ----------------------------------------------------------
    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, unless the server is over its budget and the path is not exempt (then 503)."""
        cap = self.limits.max_open
        over = len(self.connections) > cap or len(self.tasks) > cap  # both include this request's own
        if scope["type"] == "http" and over and scope["path"] not in self.limits.exempt:
            self.logger.warning("%d open connections, %d requests: over --max-connections %d, answered 503",
                                len(self.connections), len(self.tasks), cap)
            error = APIError(503, f"the server has more than {cap} open connections (--max-connections): "
                             "retry shortly", "server_error", code="overloaded")
            await error.response({"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})(scope, receive, send)
            return
        await self._app(scope, receive, send)
