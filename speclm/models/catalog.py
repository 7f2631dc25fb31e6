"""Every model a name can mean: registered models (store), their prepared
variants (``NAME@QUANT``, variants) and local GGUF files. The one place that
knows all three, so store and variants need not know each other's callers."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from speclm.errors import ModelError
from speclm.models.registry import REGISTRY
from speclm.models.store import (ModelStatus, cache_dir, local_gguf, model_path, model_state, sha256_file,
                                 unknown_model, verify_model)
from speclm.models.variants import SEP, derived_name, list_variants, read_manifest, resolve_variant, split_name


def resolve_model(name_or_path: str) -> Path:
    """The GGUF path to load: a registered name (assembled/verified), a prepared
    variant ``NAME@QUANT``, or a local GGUF file.

    Registered names win over a same-named file in the working directory.
    """
    if name_or_path in REGISTRY:
        return verify_model(name_or_path, full=False)
    variant = name_or_path.rpartition(SEP)[0] in REGISTRY and not name_or_path.endswith(".gguf")
    if not variant and ("/" in name_or_path or name_or_path.endswith(".gguf") or os.path.isfile(name_or_path)):
        return local_gguf(name_or_path)
    if variant:
        return resolve_variant(name_or_path)
    raise unknown_model(name_or_path)


def canonical_name(name_or_path: str) -> str:
    """The name a model is recorded under: a variant's NAME@QUANT with its quant tag as
    `speclm models prepare` wrote it (NAME@Q4_0 -> NAME@q4_0); any other name or path as given."""
    if SEP not in name_or_path or name_or_path in REGISTRY or os.path.isfile(os.path.expanduser(name_or_path)):
        return name_or_path
    try:
        return derived_name(*split_name(name_or_path))
    except ModelError:
        return name_or_path


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


def identify(path: Path) -> tuple[str, str]:
    """(name, sha256) of the model file at `path`, without reading it where it is known:
    a registered model's name and registry sha256 when `path` is its file at its size
    (resolve_model verified it), a prepared variant's as recorded when size and mtime
    still match; else the file's name and its sha256, hashed once per (path, size, mtime)."""
    path = Path(path).resolve()
    st = path.stat()
    for spec in REGISTRY.values():
        try:
            if model_path(spec).resolve() == path and st.st_size == spec.size:
                return spec.name, spec.sha256
        except ModelError:  # not installed
            continue
    for name, entry in read_manifest().items():
        if (cache_dir() / str(entry.get("file"))).resolve() == path and \
                (entry.get("size"), entry.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
            return name, str(entry.get("sha256"))
    return path.name, _hashed(str(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _hashed(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))  # size and mtime_ns key the cache: a rewritten file is hashed again
