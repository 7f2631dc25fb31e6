"""The engine deployment's request router (docs/distributed.md#affinity).

Ray Serve's consistent-hash router, with one change: a routing key seen for
the first time goes to the replica that is home to the fewest keys (ties: the
hash ring's order), and stays there while that replica lives. Pure hashing
can put several tenants on one replica and none on another; this keeps homes
balanced while every request of a tenant still reaches the replica holding its
caches. When the home replica is full, the next replicas on the ring take the
request (a move for that request only; the tenant's home does not change).
Homes live in this router (the ingress): one ingress replica sees every key.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter

MAX_HOMES = 1 << 16  # keys remembered (prompt-prefix keys of the shared scope are many); the oldest go first
HOME = "home:"  # marks a routing key the ingress gave (a session id), as against a call's own request id


class TenantRouter(ConsistentHashRouter):
    """Sticky, balanced homes for routing keys (RequestMetadata.session_id)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._homes: OrderedDict[str, object] = OrderedDict()

    def _routing_key(self, pending_request) -> str | None:
        key = super()._routing_key(pending_request)
        if key is not None and pending_request.metadata.session_id:
            return HOME + key
        return key  # a call without a session id (the ingress asking for the model card): no home

    def _lookup_ranked_replicas(self, routing_key: str) -> list:
        ring = super()._lookup_ranked_replicas(routing_key)
        if not ring or not routing_key.startswith(HOME):
            return ring
        live = self._replica_set_snapshot
        home = self._homes.get(routing_key)
        if home not in live:
            held = Counter(h for h in self._homes.values() if h in live)
            order = ring + sorted((r for r in live if r not in ring), key=str)
            home = min(order, key=lambda r: held[r])  # the first of the least-held, in ring order
            self._homes[routing_key] = home
            while len(self._homes) > MAX_HOMES:
                self._homes.popitem(last=False)
        self._homes.move_to_end(routing_key)
        return [home] + [r for r in ring if r != home][:self._num_fallback_replicas]
