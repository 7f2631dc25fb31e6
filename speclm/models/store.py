"""Locate, assemble and verify the embedded GGUF models.

Chunked models are concatenated from their distributions into
``cache_dir()/<name>.gguf`` (temp file + atomic ``os.replace``), hashed while
copying. A successful full check writes a JSON stamp {size, mtime_ns, sha256};
later fast checks trust a file whose size and mtime_ns still match its stamp
(an edit that restores the mtime is only caught by ``verify_model(full=True)``).
The model packages are never imported: files are found via importlib.metadata.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from speclm.errors import ModelError
from speclm.models.registry import REGISTRY, ModelSpec

BLOCK = 8 * 1024 * 1024  # stream in 8 MiB blocks; never hold a model in RAM
GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'speclm[models]'"


class CorruptModelError(ModelError):
    """A model file exists but has the wrong size or sha256."""


def cache_dir() -> Path:
    """$SPECLM_CACHE_DIR, else $XDG_CACHE_HOME/speclm, else ~/.cache/speclm; created on demand."""
    env = os.environ.get("SPECLM_CACHE_DIR")
    if env:
        path = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "speclm"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create cache dir {path} ({exc.strerror}); set SPECLM_CACHE_DIR to a writable directory") from exc
    return path


def get_spec(name: str) -> ModelSpec:
    """The registered spec for ``name``; ModelError listing known names otherwise."""
    if name not in REGISTRY:
        raise unknown_model(name)
    return REGISTRY[name]


def unknown_model(name: str) -> ModelError:
    known = ", ".join(sorted(REGISTRY))
    return ModelError(f"unknown model {name!r}; known models: {known} (a local .gguf path also works)")


def _reinstall_hint(dist: str, version: str) -> str:
    return f"pip install --force-reinstall {dist}=={version}"


def _part_number(path: Path) -> int:
    match = re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else 0


def _dist_files(spec: ModelSpec, dist_name: str) -> tuple[md.Distribution, list[md.PackagePath]]:
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise ModelError(f"model {spec.name} needs distribution {dist_name}, which is not installed; run `{INSTALL_HINT}`") from None
    if dist.version != spec.version:
        raise ModelError(f"model {spec.name} needs {dist_name}=={spec.version} but {dist.version} is installed; run `{_reinstall_hint(dist_name, spec.version)}`")
    return dist, list(dist.files or [])


def _located(spec: ModelSpec, dist_name: str, dist: md.Distribution, rec: md.PackagePath, check_size: bool) -> Path:
    """Absolute path of ``rec``; ModelError if missing or (``check_size``) its size disagrees with RECORD."""
    path = Path(dist.locate_file(rec))
    fix = _reinstall_hint(dist_name, spec.version)
    if not path.is_file():
        raise ModelError(f"model {spec.name}: file {path} of distribution {dist_name} is missing; run `{fix}`")
    if check_size and rec.size is not None and path.stat().st_size != rec.size:
        raise ModelError(f"model {spec.name}: file {path} of distribution {dist_name} is {path.stat().st_size} bytes, expected {rec.size} (short or damaged); run `{fix}`")
    return path


def chunk_paths(spec: ModelSpec) -> list[Path]:
    """Source files of ``spec`` in concatenation order (one path for a single-file model).

    Each distribution contributes its ``data/partNN.bin`` files sorted by part number.
    """
    paths: list[Path] = []
    for dist_name in spec.distributions:
        dist, files = _dist_files(spec, dist_name)
        if spec.single_file is not None:
            recs = [f for f in files if f.as_posix() == spec.single_file]
        else:
            recs = sorted((f for f in files if re.fullmatch(r"[^/]+/data/part\d+\.bin", f.as_posix())), key=_part_number)
        if not recs:
            want = spec.single_file or "data/partNN.bin"
            raise ModelError(f"model {spec.name}: distribution {dist_name} has no {want}; run `{_reinstall_hint(dist_name, spec.version)}`")
        paths.extend(_located(spec, dist_name, dist, rec, spec.single_file is None) for rec in recs)
    return paths


def sha256_file(path: Path) -> str:
    """Hex sha256 of ``path``, streamed in BLOCK-sized reads."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def model_path(spec: ModelSpec) -> Path:
    """Where the finished GGUF of ``spec`` lives (may not exist yet)."""
    if spec.single_file is not None:
        return chunk_paths(spec)[0]
    return cache_dir() / f"{spec.name}.gguf"


def _stamp_path(spec: ModelSpec, path: Path) -> Path:
    if spec.single_file is None:
        return path.with_name(path.name + ".verified")
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / f"{spec.name}-{key}.verified"


def _read_stamp(stamp: Path) -> dict | None:
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


def _write_stamp(spec: ModelSpec, path: Path, sha: str) -> None:
    st = path.stat()
    data = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha, "path": str(path)}
    stamp = _stamp_path(spec, path)
    tmp = stamp.with_name(stamp.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, stamp)
    except OSError:
        tmp.unlink(missing_ok=True)  # a missing stamp only costs a rehash next time


def _problem(spec: ModelSpec, path: Path, full: bool) -> str | None:
    """Why ``path`` is not ``spec``'s model, or None if it is (writing a fresh stamp)."""
    size = path.stat().st_size
    if size != spec.size:
        kind = "truncated" if size < spec.size else "size mismatch"
        return f"{kind}: {size} bytes, expected {spec.size}"
    stamp = _stamp_path(spec, path)
    if not full:
        data = _read_stamp(stamp)
        st = path.stat()
        if data and data.get("sha256") == spec.sha256 and data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns:
            return None
    got = sha256_file(path)
    if got != spec.sha256:
        stamp.unlink(missing_ok=True)
        return f"sha256 mismatch: expected {spec.sha256[:12]}…, got {got[:12]}…"
    _write_stamp(spec, path, got)
    return None


def repair_hint(spec: ModelSpec) -> str:
    """The command that fixes a corrupt copy of ``spec``."""
    if spec.single_file is not None:
        return _reinstall_hint(spec.distributions[0], spec.version)
    return f"speclm models verify {spec.name} --repair"


def _corrupt(spec: ModelSpec, path: Path, why: str) -> CorruptModelError:
    return CorruptModelError(f"model file {path} is corrupt ({why}); repair it with `{repair_hint(spec)}`")


def assemble(spec: ModelSpec) -> Path:
    """Concatenate the chunks of ``spec`` into its cache file, checking size and sha256."""
    chunks = chunk_paths(spec)
    total = sum(p.stat().st_size for p in chunks)
    if total != spec.size:
        raise ModelError(f"chunks of model {spec.name} total {total} bytes, expected {spec.size} (missing or short parts); run `pip install --force-reinstall 'speclm[models]'`")
    dest = model_path(spec)
    free = shutil.disk_usage(dest.parent).free
    if free < spec.size:
        raise ModelError(f"not enough disk space in {dest.parent} to assemble {spec.name} ({spec.size} bytes needed, {free} free); free space or set SPECLM_CACHE_DIR")
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{spec.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the model is not secret
        got = digest.hexdigest()
        if tmp.stat().st_size != spec.size or got != spec.sha256:
            raise ModelError(f"assembling {spec.name} from its distributions gave sha256 {got[:12]}…, expected {spec.sha256[:12]}…; run `pip install --force-reinstall 'speclm[models]'`")
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"cannot assemble {dest} ({exc.strerror or exc}); free disk space or set SPECLM_CACHE_DIR") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(spec, dest, got)
    return dest


def verify_model(name: str, full: bool = True) -> Path:
    """Path of registered model ``name`` after checking it (assembling it if absent).

    ``full=False`` trusts a stamp whose size and mtime_ns match. Raises ModelError if corrupt.
    """
    spec = get_spec(name)
    path = model_path(spec)
    if not path.exists():
        return assemble(spec)
    why = _problem(spec, path, full)
    if why:
        raise _corrupt(spec, path, why)
    return path


def repair_model(name: str) -> Path:
    """Delete and reassemble ``name``'s cache file; single-file models need a reinstall."""
    spec = get_spec(name)
    if spec.single_file is not None:
        raise ModelError(f"model {name} is used in place from its distribution and cannot be rebuilt; run `{repair_hint(spec)}`")
    path = model_path(spec)
    path.unlink(missing_ok=True)
    _stamp_path(spec, path).unlink(missing_ok=True)
    return assemble(spec)


def local_gguf(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        known = ", ".join(sorted(REGISTRY))
        raise ModelError(f"model file {path} does not exist; pass an existing .gguf path or a known model ({known})")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelError(f"cannot read model file {path} ({exc.strerror or exc}); pass a readable .gguf file") from exc
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF'); pass a .gguf model file")
    return path


@dataclass
class ModelStatus:
    """One row of ``list_models``. ``state``: ready | not assembled | not installed | corrupt: <why>."""

    name: str
    description: str
    role: str
    path: Path | None
    state: str


def model_state(spec: ModelSpec) -> tuple[Path | None, str]:
    try:
        path = model_path(spec)
    except ModelError:
        return None, "not installed"
    if not path.exists():
        try:
            chunk_paths(spec)
        except ModelError:
            return None, "not installed"
        return None, "not assembled"
    why = _problem(spec, path, full=False)
    return path, f"corrupt: {why}" if why else "ready"
