"""Every model a name can mean: registered models (store), their prepared
variants (``NAME@QUANT``, variants) and local GGUF files. The one place that
knows all three, so store and variants need not know each other's callers."""

from __future__ import annotations

import os
from pathlib import Path

from speclm.models.registry import REGISTRY
from speclm.models.store import ModelStatus, local_gguf, model_state, unknown_model, verify_model
from speclm.models.variants import SEP, list_variants, resolve_variant


def resolve_model(name_or_path: str) -> Path:
    """The GGUF path to load: a registered name (assembled/verified), a prepared
    variant ``NAME@QUANT``, or a local GGUF file.

    Registered names win over a same-named file in the working directory.
    """
    if name_or_path in REGISTRY:
        return verify_model(name_or_path, full=False)
    if name_or_path.rpartition(SEP)[0] in REGISTRY and not name_or_path.endswith(".gguf"):
        return resolve_variant(name_or_path)
    if "/" in name_or_path or name_or_path.endswith(".gguf") or os.path.isfile(name_or_path):
        return local_gguf(name_or_path)
    raise unknown_model(name_or_path)


def list_models() -> list[ModelStatus]:
    """Status of every registered model, then of prepared variants; hashes only files whose stamp is stale."""
    rows = []
    for spec in REGISTRY.values():
        path, state = model_state(spec)
        rows.append(ModelStatus(spec.name, spec.description, spec.role, path, state))
    for v in list_variants():
        rows.append(ModelStatus(v.name, f"{REGISTRY[v.source].description} requantised to {v.quant.upper()}",
                                REGISTRY[v.source].role, v.path, v.state))
    return rows
