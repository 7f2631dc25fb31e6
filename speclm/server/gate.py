"""The HTTP gate in front of every route: who the caller is and whether it may
call the route (access.py; handlers read it with `caller_of` and `tenant_of`),
then the body-size and body-time limits."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .access import Access, Caller
from .api_errors import APIError


class Gate:
    """Middleware: the keys' rights, then the body-size limit (the body is buffered, up to
    max_body_bytes, arriving within body_timeout_s). Nothing behind it, the engine's
    queue included, sees a request before its whole body."""

    def __init__(self, app: ASGIApp, access: Access, max_body_bytes: int, body_timeout_s: float):
        self.app, self.access = app, access
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        caller = self.access.caller(scope)
        scope.setdefault("state", {})[_CALLER] = caller
        error = self.access.refusal(scope["path"], caller)
        refusal = error.response() if error is not None else None
        if refusal is None:
            receive, refusal = await self._read_body(receive)
        await (refusal or self.app)(scope, receive, send)

    async def _read_body(self, receive: Receive) -> tuple[Receive, Response | None]:
        """Buffer the body (<= the limit) and replay it; over the limit: drain, then 413;
        not all there within body_timeout_s: 408 (a stalled client holds no slot for long)."""
        seconds = self.body_timeout_s
        try:
            return await asyncio.wait_for(self._buffer_body(receive), seconds)
        except asyncio.TimeoutError:
            return receive, APIError(408, f"the request body did not arrive within {seconds:g} s: send it "
                                     "at once", code="request_timeout").response({"Connection": "close"})

    async def _buffer_body(self, receive: Receive) -> tuple[Receive, Response | None]:
        limit, chunks, size = self.max_body_bytes, [], 0
        while (message := await receive())["type"] == "http.request":
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                if message.get("more_body"):
                    await _drain(receive)
                return receive, APIError(413, f"the request body exceeds the limit of {limit} bytes",
                                         code="request_too_large").response()
            if not message.get("more_body"):
                message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        first = [message]

        async def replay() -> dict:
            return first.pop() if first else await receive()

        return replay, None


_CALLER = "speclm_caller"


def caller_of(request: Request) -> Caller:
    """Who the gate found sent this request."""
    return request.scope["state"][_CALLER]


def tenant_of(request: Request) -> str | None:
    """The tenant the gate admitted this request as (None: the server has no keys)."""
    return caller_of(request).tenant


async def _drain(receive: Receive, cap: int = 64 << 20) -> None:
    """Read and discard the rest of a body (so the client can read our answer)."""
    seen = 0
    while seen <= cap:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return
