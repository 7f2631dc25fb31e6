"""The HTTP gate in front of every route: the API key (each key is a tenant, which
handlers read with `tenant_of`), then the body-size and body-time limits."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .schemas import APIError
from .tenants import Tenants


class Gate:
    """Middleware: the API key, then the body-size limit (the body is buffered, up to
    max_body_bytes, arriving within body_timeout_s)."""

    def __init__(self, app: ASGIApp, tenants: Tenants, max_body_bytes: int, body_timeout_s: float):
        self.app, self.tenants = app, tenants
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refuse_auth(scope) if scope["type"] == "http" else None
        if refusal is None and scope["type"] == "http":
            receive, refusal = await self._read_body(receive)
        await (refusal or self.app)(scope, receive, send)

    def _refuse_auth(self, scope: Scope) -> Response | None:
        tenants, path = self.tenants, scope["path"]
        if not tenants.guarded or not (path.startswith(("/v1/", "/admin/")) or path == "/metrics"):
            return None
        auth = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        tenant = tenants.tenant_of(token.strip()) if scheme.lower() == b"bearer" else None
        if tenant is not None:
            scope.setdefault("state", {})[_TENANT] = tenant
            return None
        message = "incorrect API key provided" if auth else "missing API key: send `Authorization: Bearer KEY`"
        return APIError(401, message, code="invalid_api_key").response({"WWW-Authenticate": "Bearer"})

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


_TENANT = "speclm_tenant"


def tenant_of(request: Request) -> str | None:
    """The tenant the gate admitted this request as (None: the server has no keys)."""
    return request.scope.get("state", {}).get(_TENANT)


async def _drain(receive: Receive, cap: int = 64 << 20) -> None:
    """Read and discard the rest of a body (so the client can read our answer)."""
    seen = 0
    while seen <= cap:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return
