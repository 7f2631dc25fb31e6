"""What Ray gave the calling actor: llama.cpp computes with those CPUs, never os.cpu_count()."""

from __future__ import annotations

import ray


def assigned_threads() -> int:
    """llama.cpp threads for this actor: the CPUs Ray assigned it (at least 1)."""
    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
