"""Assemble and run the Ray Serve application (docs/distributed.md).

`application(spec)` is what `serve run`/`serve deploy` and KubeRay's RayService
start (through `speclm.commands.serve:ray_app`, which builds the spec from
`speclm serve`'s own flags); `run(spec, host)` is `speclm serve --ray`.
"""

from __future__ import annotations

import logging
import os

import ray
from ray import serve

from ..errors import InvalidRequestError
from .ingress import Ingress
from .replica import EngineReplica
from .routing import router_config
from .settings import NAMESPACE, ReplicaSpec
from .speculator import start_speculator

log = logging.getLogger("speclm.distributed")

APP_NAME = "speclm"
ENGINE = "speclm-engine"
INGRESS = "speclm-ingress"
HEALTH_CHECK_PERIOD_S = 5.0


def application(spec: ReplicaSpec) -> serve.Application:
    """The ingress bound to `spec.ray.replicas` engine replicas; starts the speculator
    actor first when `spec.ray.speculator_node` asks for one."""
    cfg, ray_settings = spec.server, spec.ray
    if ray_settings.speculator_node:
        if spec.speculator is None or spec.llm.get("draft") is None:
            raise InvalidRequestError("--speculator-node runs the SSD speculator: it needs a draft model (--draft)")
        sessions = ray_settings.replicas * cfg.max_concurrency
        start_speculator(str(spec.llm["draft"]), spec.speculator.sized(spec.llm.get("n_ctx"), sessions))
    engine = serve.deployment(EngineReplica).options(
        name=ENGINE, num_replicas=ray_settings.replicas,
        ray_actor_options={"num_cpus": ray_settings.replica_cpus},
        max_ongoing_requests=cfg.max_concurrency + cfg.max_queue,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        graceful_shutdown_timeout_s=cfg.request_timeout_s,
        **router_config(ray_settings.routing, ray_settings.fallback_replicas))
    ingress = serve.deployment(Ingress).options(
        name=INGRESS, num_replicas=1, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=ray_settings.replicas * (cfg.max_concurrency + cfg.max_queue) + 32)
    return ingress.bind(engine.bind(spec), spec)


def connect(address: str | None) -> None:
    """Join the cluster at `address`, or start a local one (None)."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, include_dashboard=False,
                 runtime_env={"env_vars": {k: v for k, v in os.environ.items()
                                           if k.startswith("SPECLM_") and not k.endswith("_KEY")}})


def run(spec: ReplicaSpec, host: str = "127.0.0.1", port: int = 8000, blocking: bool = True,
        name: str = APP_NAME, route_prefix: str = "/") -> None:
    """Deploy the application behind Ray Serve's HTTP proxy at host:port/route_prefix;
    blocking: serve until interrupted (KeyboardInterrupt, or SystemExit from a signal),
    then take the application down (and the cluster, if this process started it)."""
    connect(spec.ray.ray_address)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(spec), name=name, route_prefix=route_prefix, blocking=blocking)
    except BaseException:
        stop(name)
        raise
    if blocking:
        stop(name)


def stop(name: str = APP_NAME) -> None:
    """Delete the application (its replicas drain through Serve's graceful shutdown) and
    leave the cluster (a local one, started by connect, stops with it)."""
    try:
        serve.delete(name)
    finally:
        ray.shutdown()
