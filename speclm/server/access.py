"""Who may read and do what (docs/server.md#auth-and-tenants): least privilege per key.

Contracts:
- A tenant holds one of the API keys (tenants.py). It may call /v1/* and clear
  its own caches (POST /admin/cache/clear). It may not read /metrics (403):
  every series there but the caches' aggregates all tenants' traffic, and the
  cache series name the other tenants.
- The operator holds the operator key (ServerConfig.operator_key). It may read
  /metrics and /health's details and clear any tenant's caches
  (/admin/cache/clear?tenant=ID). It is no tenant: on a server with API keys
  /v1/* refuses it (403).
- Without an operator key, loopback clients (peers.py) may read /metrics and
  /health's details, the operator being on the machine; nobody may clear
  another tenant's caches.
- Without API keys every caller is the one tenant (the shared scope).
- Anyone may read /health's public view (up or shutting down, and ready).
- Keys are compared in constant time, every key every time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.types import Scope

from .peers import is_loopback
from .api_errors import APIError, quoted
from .tenants import SHARED, Tenants


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as the gate found it."""

    tenant: str | None  # the tenant its key names (None: no API key, or the server has none)
    operator: bool  # presented the operator key
    observer: bool  # may read /metrics and /health's details (the operator; loopback without an operator key)
    authorization: bool  # sent an Authorization header at all


def _denied(message: str) -> APIError:
    return APIError(403, message, "permission_error", code="permission_denied")


def _unauthorized(caller: Caller, what: str) -> APIError:
    message = f"incorrect {what} provided" if caller.authorization else \
        f"missing {what}: send `Authorization: Bearer KEY`"
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class Access:
    """The server's keys (API keys and the operator key) and what each may do."""

    def __init__(self, tenants: Tenants, operator_key: str | None):
        self.tenants = tenants
        self._operator = operator_key.encode() if operator_key else None

    def caller(self, scope: Scope) -> Caller:
        """Who sent the request of HTTP `scope` (its bearer token, its peer address)."""
        auth = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        token = token.strip() if scheme.lower() == b"bearer" else None
        tenant = self.tenants.tenant_of(token) if token is not None else None
        operator = self._operator is not None and token is not None and hmac.compare_digest(token, self._operator)
        local = is_loopback((scope.get("client") or ("",))[0])
        return Caller(tenant, operator, operator or (self._operator is None and local), bool(auth))

    def refusal(self, path: str, caller: Caller) -> APIError | None:
        """Why `caller` may not call `path` (401: no or a wrong key; 403: a key without
        the right), or None when it may. Unknown paths are the router's (404)."""
        if path == "/metrics":
            if caller.observer:
                return None
            if self._operator is None:
                return _denied("/metrics is served to loopback clients only: set an operator key "
                               "(SPECLM_OPERATOR_KEY) to read it from elsewhere")
            if caller.tenant is not None:
                return _denied("/metrics covers every tenant: it needs the operator key, not an API key")
            return _unauthorized(caller, "operator key")
        if path.startswith(("/v1/", "/admin/")) and self.tenants.guarded and caller.tenant is None:
            if caller.operator and path.startswith("/admin/"):
                return None
            if caller.operator:
                return _denied("the operator key is no API key: /v1 routes need a tenant's key")
            return _unauthorized(caller, "API key")
        return None

    def cache_scope(self, caller: Caller, tenant: str | None) -> str | None:
        """The cache scope POST /admin/cache/clear clears for `caller`: its own, or with
        ?tenant=ID (an id from /metrics, or `shared`) that tenant's, for the operator only."""
        if tenant is None:
            if self.tenants.guarded and caller.tenant is None:  # the operator, who is no tenant
                raise APIError(400, "name the tenant whose caches to clear: ?tenant=ID (an id from /metrics, "
                               f"or {SHARED})", param="tenant")
            return self.tenants.scope_of(caller.tenant)
        if not caller.operator:
            raise _denied("only the operator key may clear another tenant's caches (?tenant=)")
        if tenant == SHARED:
            return None
        if tenant not in self.tenants.ids:
            raise APIError(404, f"no tenant {quoted(tenant)}: name one from /metrics, or {SHARED}",
                           param="tenant", code="tenant_not_found")
        return self.tenants.scope_of(tenant)
