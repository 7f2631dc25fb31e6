"""The SSD speculator as a named Ray actor on its own node (docs/distributed.md#speculator).

The actor needs the `speculator` resource, so Ray places it on the node that
offers it; it runs `speclm speculator` (ssd/worker.py) bound to a TCP port of
that node, and exits with it (the worker watches its parent's pid). Ray restarts
a lost actor; replicas find the speculator by name at every (re)start
(SpeculatorConfig.locate), so a restarted one on a new port is found again.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time

import ray

from ..speculative.ssd.client import SpeculatorConfig, worker_command
from .cpus import assigned_threads
from .settings import NAMESPACE, SPECULATOR_RESOURCE

NAME = "speclm-speculator"
LOOKUP_TIMEOUT_S = 10.0


class SpeculatorHost:
    """Runs one speculator worker for `model` on this node."""

    def __init__(self, model: str, cfg: SpeculatorConfig):
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        self.addr = f"tcp://{ip}:{port}"
        self.proc = subprocess.Popen(worker_command(model, dataclasses.replace(cfg, threads=assigned_threads()),
                                                    self.addr),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.started = time.time()

    def address(self) -> str:
        """The worker's ZeroMQ address; raises once the worker has exited (Ray then restarts us)."""
        if self.proc.poll() is not None:
            os._exit(1)  # the actor dies with its worker, and Ray starts both anew
        return self.addr

    def info(self) -> dict:
        return {"addr": self.addr, "pid": self.proc.pid, "node": ray.get_runtime_context().get_node_id()[:12],
                "started": self.started}


def start_speculator(model: str, cfg: SpeculatorConfig) -> ray.actor.ActorHandle:
    """Start (or find) the named speculator actor on the `speculator` node."""
    return ray.remote(SpeculatorHost).options(
        name=NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached", max_restarts=-1,
        max_task_retries=-1, num_cpus=1, resources={SPECULATOR_RESOURCE: 1}).remote(model, cfg)


def locate_speculator() -> str:
    """The speculator's current address (SpeculatorConfig.locate); raises if there is none now."""
    actor = ray.get_actor(NAME, namespace=NAMESPACE)
    return ray.get(actor.address.remote(), timeout=LOOKUP_TIMEOUT_S)
