"""Who the replicas are: a named actor (one per application) each engine replica reports to every
second (its health and its Prometheus exposition), which the ingress reads for
/health and /metrics, and through which it asks every replica to clear a
cache scope (Ray Serve routes a handle call to one replica, never to all).

A replica not heard from within STALE_S counts as lost; one heard from
saying it is draining (Ray Serve is stopping it) as draining.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import ray
from ray import serve

from .settings import NAMESPACE

NAME = "speclm-directory"
STALE_S = 5.0
CLEAR_WAIT_S = 5.0


class Directory:
    """Replica reports, and cache-clearing orders until every live replica has done them."""

    def __init__(self):
        self.reports: dict[str, dict] = {}  # replica -> {"seen": monotonic, "health": {...}, "metrics": bytes}
        self.orders: dict[int, dict] = {}  # id -> {"scope", "results": {replica: dict}, "event"}
        self._ids = itertools.count(1)

    def report(self, replica: str, health: dict, metrics: bytes) -> list[tuple[int, str | None]]:
        """Record a replica's state; returns the clear orders it has not done yet."""
        self.reports[replica] = {"seen": time.monotonic(), "health": health, "metrics": metrics}
        return [(oid, o["scope"]) for oid, o in self.orders.items() if replica not in o["results"]]

    def done(self, order: int, replica: str, result: dict) -> None:
        o = self.orders.get(order)
        if o is not None:
            o["results"][replica] = result
            if set(self.live()) <= set(o["results"]):
                o["event"].set()

    def live(self) -> list[str]:
        now = time.monotonic()
        return [r for r, rep in self.reports.items() if now - rep["seen"] <= STALE_S]

    def replicas(self) -> list[dict]:
        """Each replica ever heard from: {"replica", "state": running | draining | lost, "seen_s_ago", ...}."""
        now = time.monotonic()
        rows = []
        for name, rep in sorted(self.reports.items()):
            ago = now - rep["seen"]
            state = "lost" if ago > STALE_S else ("draining" if rep["health"].get("status") != "ok" else "running")
            rows.append({"replica": name, "state": state, "seen_s_ago": round(ago, 1), **rep["health"]})
        return rows

    def metrics(self) -> dict[str, bytes]:
        return {r: self.reports[r]["metrics"] for r in self.live()}

    async def clear(self, scope: str | None) -> dict[str, dict]:
        """Have every live replica clear `scope`; {replica: what it held}, after all did
        (or CLEAR_WAIT_S passed: those that had not are missing)."""
        oid = next(self._ids)
        order = self.orders[oid] = {"scope": scope, "results": {}, "event": asyncio.Event()}
        try:
            await asyncio.wait_for(order["event"].wait(), CLEAR_WAIT_S)
        except asyncio.TimeoutError:
            pass
        return self.orders.pop(oid)["results"]


def directory() -> ray.actor.ActorHandle:
    """The directory of the calling replica's application (started on first use; it
    outlives the replicas that report to it)."""
    app = serve.get_replica_context().app_name
    return ray.remote(Directory).options(name=f"{NAME}-{app}", namespace=NAMESPACE, get_if_exists=True,
                                         lifetime="detached", num_cpus=0, max_restarts=-1).remote()
