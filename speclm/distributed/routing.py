"""Which replica a request should go to: the routing key the ingress hands the
engine deployment's router (router.py; docs/distributed.md#affinity).

A tenant's requests share one key, its tenant id (a hash of its API key, never
the key), so they reach the replica holding its suffix cache and prompt KV
copies. Requests of the shared scope (no keys, or a shared cache) are keyed by
their prompt's beginning instead, so the same prefix returns to the replica
that holds its KV and different prompts spread over the replicas.
"""

from __future__ import annotations

import hashlib
import json

from ..server.schemas import ChatCompletionRequest, _GenerationRequest

PREFIX_CHARS = 512  # how much of the prompt decides a shared-scope request's replica

AFFINITY_ROUTER = "speclm.distributed.router.TenantRouter"


def routing_key(req: _GenerationRequest, scope: str | None) -> str:
    """The key of `req` whose cache scope is `scope` (a tenant id, or None: shared)."""
    if scope is not None:
        return scope
    text = (json.dumps([m.model_dump(exclude_none=True) for m in req.messages], ensure_ascii=False)
            if isinstance(req, ChatCompletionRequest) else json.dumps(req.prompt, ensure_ascii=False))
    return "p-" + hashlib.sha256(text[:PREFIX_CHARS].encode()).hexdigest()[:16]


def router_config(routing: str, fallback_replicas: int) -> dict:
    """The engine deployment's request_router_config for `routing` (settings.ROUTINGS)."""
    if routing == "balanced":
        return {}
    return {"request_router_config": {"request_router_class": AFFINITY_ROUTER,
                                      "request_router_kwargs": {"num_fallback_replicas": fallback_replicas}}}
