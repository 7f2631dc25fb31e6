"""The settings of a Ray Serve deployment, declared once (speclm/options.py):
`speclm serve --ray`'s flags come from RaySettings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from ..options import option
from ..server.config import ServerConfig
from ..speculative.config import SpecConfig
from ..speculative.ssd.client import SpeculatorConfig

ROUTINGS = ("affinity", "balanced")
NAMESPACE = "speclm"  # the Ray namespace of speclm's named actors
SPECULATOR_RESOURCE = "speculator"  # the custom resource of the node that runs the SSD speculator


@dataclass(frozen=True)
class RaySettings:
    """How the deployment spreads over the cluster."""

    ray_address: str | None = option(None, "join this Ray cluster (e.g. ray://head:10001 or auto); default: "
                                     "start a local one", flag="--ray-address")
    replicas: int = option(2, "engine replicas (each loads the models once)")
    replica_cpus: float = option(1.0, "CPUs Ray gives each replica: its llama.cpp threads", kind=float)
    routing: str = option("affinity", "affinity: a tenant's requests go to the replica holding its caches "
                          "(no keys: by prompt prefix); balanced: Ray Serve's default (least loaded of two)",
                          choices=ROUTINGS)
    fallback_replicas: int = option(1, "affinity: replicas tried after a tenant's own when it is full")
    speculator_node: bool = option(False, "run the SSD speculator as a Ray actor on a node with the "
                                   f"`{SPECULATOR_RESOURCE}` resource (else each replica spawns its own)")
    retries: int = option(2, "times a request whose replica died before its first token is sent to another")

    def __post_init__(self) -> None:
        if self.replicas < 1 or not self.replica_cpus > 0 or self.fallback_replicas < 0 or self.retries < 0:
            raise InvalidRequestError("--replicas must be >= 1, --replica-cpus > 0, --fallback-replicas and "
                                      "--retries >= 0")
        if self.routing not in ROUTINGS:
            raise InvalidRequestError(f"--routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")


@dataclass(frozen=True)
class ReplicaSpec:
    """What each engine replica loads and how it serves (built by `speclm serve --ray`
    from the same flags as `speclm serve`). llm: LLM's keyword arguments but for
    n_threads (the replica's CPUs) and the speculator's placement."""

    llm: dict[str, Any]
    server: ServerConfig
    spec: SpecConfig
    speculator: SpeculatorConfig | None = None
    ray: RaySettings = field(default_factory=RaySettings)
