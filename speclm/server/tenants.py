"""API keys as tenants: who may call, and whose suffix cache a request uses.

Contracts:
- Each API key is one tenant. A tenant's id is a hash of its key ("t-" + 12 hex
  digits of sha256), never the key, so it can appear in /metrics and logs.
- A request's suffix cache and online-adapted Medusa heads are its tenant's
  (`SpecConfig.cache_scope` = the tenant id): one client's outputs never draft
  another's, because acceptance timing would leak their content.
  `share_cache` puts every tenant in one scope (None, the LLM's own).
- Without API keys there is one tenant: scope None.
- Keys are compared in constant time, all of them every time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


SHARED = "shared"  # the name of scope None (no keys, or share_cache) in metrics and answers


def tenant_id(key: str) -> str:
    """The public name of the tenant holding `key`."""
    return "t-" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Tenants:
    """The server's API keys and the cache scope each one gets."""

    def __init__(self, keys: Iterable[str], share_cache: bool = False):
        self._keys = [(k.encode(), tenant_id(k)) for k in keys]
        self.share_cache = share_cache

    @property
    def ids(self) -> tuple[str, ...]:
        """Every tenant's id."""
        return tuple(tid for _, tid in self._keys)

    @property
    def guarded(self) -> bool:
        """Whether requests need a key."""
        return bool(self._keys)

    def tenant_of(self, token: bytes) -> str | None:
        """The tenant id of a presented bearer token, or None if no key matches."""
        found = None
        for key, tid in self._keys:
            if hmac.compare_digest(token, key):
                found = tid
        return found

    def scope_of(self, tenant: str | None) -> str | None:
        """The cache scope of a tenant's requests."""
        return None if self.share_cache else tenant


def split_keys(value: str | None) -> list[str]:
    """Keys from a comma-separated list (SPECLM_API_KEY), blanks dropped."""
    return [k.strip() for k in (value or "").split(",") if k.strip()]
