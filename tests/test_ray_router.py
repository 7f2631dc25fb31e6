"""TenantRouter's choice (speclm/distributed/router.py), without a cluster: balanced,
sticky homes for the ingress's routing keys; calls without one are not given homes."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest

pytest.importorskip("ray", reason="Ray Serve is not installed: pip install 'speclm[ray]'")
from ray.serve.experimental.consistent_hash_router import _hash_bytes  # noqa: E402

from speclm.distributed.router import TenantRouter  # noqa: E402


def router(replicas: list[str], fallbacks: int = 1) -> TenantRouter:
    """A TenantRouter over a ring of `replicas` (as update_replicas would build it)."""
    r = TenantRouter.__new__(TenantRouter)
    pairs = sorted((_hash_bytes(f"{x}:{i}".encode()), x) for x in replicas for i in range(100))
    r._ring_hashes, r._ring_replicas = [h for h, _ in pairs], [x for _, x in pairs]
    r._replica_set_snapshot, r._num_fallback_replicas, r._homes = frozenset(replicas), fallbacks, OrderedDict()
    return r


def request(session: str = "", internal: str = "uuid-1") -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(session_id=session, internal_request_id=internal))


def home(r: TenantRouter, pending: SimpleNamespace) -> str:
    return r._lookup_ranked_replicas(r._routing_key(pending))[0]


def test_new_tenants_get_the_replica_with_fewest_homes_then_stay():
    r = router(["r1", "r2", "r3"])
    for i in range(5):  # calls without a routing key (the ingress's card request) take no home
        home(r, request(internal=f"uuid-{i}"))
    homes = {t: home(r, request(t)) for t in ("t-a", "t-b", "t-c", "t-d")}
    assert sorted(list(homes.values()).count(x) for x in ("r1", "r2", "r3")) == [1, 1, 2]
    for _ in range(3):
        assert {t: home(r, request(t)) for t in homes} == homes


def test_a_dead_home_is_replaced_and_the_ring_gives_fallbacks():
    r = router(["r1", "r2", "r3"], fallbacks=1)
    first = home(r, request("t-a"))
    ranked = r._lookup_ranked_replicas(r._routing_key(request("t-a")))
    assert len(ranked) == 2 and ranked[0] == first and ranked[1] != first
    alive = [x for x in ("r1", "r2", "r3") if x != first]
    r2 = router(alive)
    r2._homes = r._homes  # the same router after the replica set changed
    assert home(r2, request("t-a")) in alive
