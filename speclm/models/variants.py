"""Requantised variants of the registered models ("verify-friendly targets").

On a CPU the cost of scoring a block of k tokens depends on the weights'
quantisation type (docs/results.md#machines): Q4_0 has kernels that stay efficient for
small blocks, the shipped Q4_K_M does not. ``prepare_variant`` rewrites a
verified registered model to another type with llama.cpp's own quantizer
(``llama_model_quantize``) into ``cache_dir()/<name>@<quant>.gguf``.

A variant is a different model: speculative output is lossless against the
variant, not against the model it was made from.

``--pure`` (``NAME@QUANT-pure``, e.g. ``qwen2.5-coder-1.5b@q4_0-pure``) also
quantises the output head and the token embedding to QUANT; a plain
requantisation leaves them at a higher type (Q6_K/Q8_0), which makes every
extra verified row pay for the head through a slow kernel (docs/kernels.md).
The tag ``QUANT-pure`` is the variant's "quant" everywhere a name is parsed.

Each prepared file is recorded in ``cache_dir()/variants.json`` (its size,
sha256, mtime_ns, the source's sha256, the quant type, whether it is pure and
the llama-cpp-python version that made it). ``resolve_variant`` trusts a file
whose size and mtime_ns still match that record and rehashes it otherwise,
like store.py's stamps. The output is written to a temp file and renamed into
place, so an interrupted prepare leaves a ``.<name>@<quant>.*.part`` file,
never a short variant.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from speclm.errors import ModelError
from speclm.models.registry import REGISTRY
from speclm.models.store import GGUF_MAGIC, CorruptModelError, cache_dir, get_spec, sha256_file, verify_model

MANIFEST = "variants.json"
SEP = "@"
PURE_SUFFIX = "-pure"  # NAME@q4_0-pure: head and token embedding quantised to q4_0 too

# quant name -> (llama_cpp constant name, approximate bits per weight)
QUANTS: dict[str, tuple[str, float]] = {
    "q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", 4.5),
    "q4_1": ("LLAMA_FTYPE_MOSTLY_Q4_1", 5.0),
    "q5_0": ("LLAMA_FTYPE_MOSTLY_Q5_0", 5.5),
    "q5_1": ("LLAMA_FTYPE_MOSTLY_Q5_1", 6.0),
    "q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", 8.5),
    "q4_k_m": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", 4.9),
    "q5_k_m": ("LLAMA_FTYPE_MOSTLY_Q5_K_M", 5.7),
    "q6_k": ("LLAMA_FTYPE_MOSTLY_Q6_K", 6.6),
    "iq4_nl": ("LLAMA_FTYPE_MOSTLY_IQ4_NL", 4.5),  # non-linear 4-bit levels in Q4_0-sized blocks; no imatrix needed
}


def _choices() -> str:
    return ", ".join(QUANTS)


def check_quant(quant: str) -> str:
    """The canonical (lower-case) quant name; ModelError listing the choices otherwise."""
    q = quant.strip().lower() if isinstance(quant, str) else quant
    if q not in QUANTS:
        raise ModelError(f"unknown quantisation type {quant!r}; choose one of: {_choices()}")
    return q


def parse_quant(tag: str) -> tuple[str, bool]:
    """(canonical quant, pure) of a quant tag ``QUANT`` or ``QUANT-pure`` (any case)."""
    t = tag.strip().lower() if isinstance(tag, str) else tag
    pure = isinstance(t, str) and t.endswith(PURE_SUFFIX)
    return check_quant(t[:-len(PURE_SUFFIX)] if pure else t), pure


def quant_tag(quant: str, pure: bool = False) -> str:
    """The canonical tag: ``q4_0``, or ``q4_0-pure`` when pure (by the flag or already in ``quant``)."""
    q, tagged = parse_quant(quant)
    return q + (PURE_SUFFIX if pure or tagged else "")


def ftype(quant: str) -> int:
    """llama.cpp's LLAMA_FTYPE_MOSTLY_* value for ``quant`` (a pure tag has its base type's)."""
    import llama_cpp
    return int(getattr(llama_cpp, QUANTS[parse_quant(quant)[0]][0]))


def derived_name(name: str, quant: str, pure: bool = False) -> str:
    """``NAME@QUANT`` or, pure, ``NAME@QUANT-pure``."""
    return f"{name}{SEP}{quant_tag(quant, pure)}"


def split_name(derived: str) -> tuple[str, str]:
    """(registered name, canonical quant tag) of ``NAME@QUANT[-pure]``; ModelError if either is unknown."""
    name, sep, quant = derived.rpartition(SEP)
    if not sep or not name:
        raise ModelError(f"{derived!r} is not a variant name; variants are named NAME{SEP}QUANT or "
                         f"NAME{SEP}QUANT{PURE_SUFFIX}, e.g. qwen2.5-coder-1.5b{SEP}q4_0")
    get_spec(name)  # unknown base name: lists the known ones
    return name, quant_tag(quant)


def variant_path(derived: str) -> Path:
    name, quant = split_name(derived)
    return cache_dir() / f"{name}{SEP}{quant}.gguf"


def _prepare_hint(name: str, tag: str, force: bool) -> str:
    quant, pure = parse_quant(tag)
    flags = (" --pure" if pure else "") + (" --force" if force else "")
    return f"speclm models prepare {name} --quant {quant}{flags}"


# ---- manifest ------------------------------------------------------------------
def manifest_path() -> Path:
    return cache_dir() / MANIFEST


def read_manifest() -> dict[str, dict]:
    """The recorded variants, {} when the manifest is missing or unreadable."""
    try:
        data = json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return {}
    return data.get("variants", {}) if isinstance(data, dict) and isinstance(data.get("variants"), dict) else {}


@contextmanager
def _locked(lock: Path, blocking: bool = True, busy: str = ""):
    """An exclusive flock on ``lock`` for the duration (raises ModelError(busy) if not blocking and held)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise ModelError(busy) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _update_manifest(key: str, entry: dict | None) -> None:
    """Set (or with None, drop) one record; read-modify-write under a lock, written atomically."""
    path = manifest_path()
    with _locked(path.with_name(MANIFEST + ".lock")):
        variants = read_manifest()
        if entry is None:
            variants.pop(key, None)
        else:
            variants[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{MANIFEST}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": 1, "variants": variants}, fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# ---- checks ----------------------------------------------------------------------
def _lock_path(derived: str) -> Path:
    return cache_dir() / f".{derived}.lock"


def _leftovers(derived: str) -> list[Path]:
    return sorted(cache_dir().glob(f".{derived}.*.part"))


def _being_prepared(derived: str) -> bool:
    """True while another process holds the prepare lock of ``derived``."""
    lock = _lock_path(derived)
    if not lock.exists():
        return False
    try:
        with _locked(lock, blocking=False, busy="busy"):
            return False
    except ModelError:
        return True


def _problem(derived: str, path: Path, entry: dict | None, full: bool) -> str | None:
    """Why ``path`` is not the recorded variant, or None (refreshing the record's mtime after a rehash)."""
    if entry is None:
        return f"it is not recorded in {manifest_path()} (missing or damaged manifest)"
    st = path.stat()
    if st.st_size != entry.get("size"):
        kind = "truncated" if st.st_size < entry.get("size", 0) else "size mismatch"
        return f"{kind}: {st.st_size} bytes, expected {entry.get('size')}"
    if not full and st.st_mtime_ns == entry.get("mtime_ns"):
        return None
    got = sha256_file(path)
    if got != entry.get("sha256"):
        return f"sha256 mismatch: expected {str(entry.get('sha256'))[:12]}…, got {got[:12]}…"
    if st.st_mtime_ns != entry.get("mtime_ns"):
        _update_manifest(derived, {**entry, "mtime_ns": st.st_mtime_ns})
    return None


def _check(derived: str, full: bool) -> Path:
    name, quant = split_name(derived)
    key = f"{name}{SEP}{quant}"
    path = variant_path(key)
    entry = read_manifest().get(key)
    if not path.exists():
        leftovers = _leftovers(key)
        if leftovers and _being_prepared(key):
            raise ModelError(f"variant {key} is being prepared by another process right now "
                             f"({leftovers[0]}); wait for it to finish")
        if leftovers:
            raise _corrupt(f"variant {key} was not finished: an interrupted prepare left {leftovers[0]}; "
                           f"rebuild it with `{_prepare_hint(name, quant, True)}`", "unfinished")
        raise ModelError(f"variant {key} is not prepared ({path} does not exist); "
                         f"run `{_prepare_hint(name, quant, False)}`")
    why = _problem(key, path, entry, full)
    if why:
        raise _corrupt(f"variant file {path} is corrupt or incomplete ({why}); "
                       f"rebuild it with `{_prepare_hint(name, quant, True)}`", why)
    spec = REGISTRY[name]
    if entry.get("source_sha256") != spec.sha256:
        why = f"made from another version of {name}"
        raise _corrupt(f"variant file {path} was {why} (source sha256 {str(entry.get('source_sha256'))[:12]}…, "
                       f"registered {spec.sha256[:12]}…); rebuild it with `{_prepare_hint(name, quant, True)}`", why)
    return path


def _corrupt(message: str, reason: str) -> CorruptModelError:
    exc = CorruptModelError(message)
    exc.reason = reason
    return exc


def resolve_variant(derived: str) -> Path:
    """Path of prepared variant ``NAME@QUANT`` after a fast check (size + mtime, else full sha256).

    ModelError when it is not prepared (with the prepare command), CorruptModelError
    when it is damaged or unfinished (with the ``--force`` command that rebuilds it)."""
    return _check(derived, full=False)


def verify_variant(derived: str) -> Path:
    """Like resolve_variant but always rehashes the file."""
    return _check(derived, full=True)


# ---- prepare -----------------------------------------------------------------------
def _llama_cpp_version() -> str:
    import importlib.metadata as md
    try:
        return md.version("llama-cpp-python")
    except md.PackageNotFoundError:  # pragma: no cover - install problem
        import llama_cpp
        return getattr(llama_cpp, "__version__", "unknown")


def prepare_variant(name: str, quant: str, force: bool = False, n_threads: int | None = None,
                    pure: bool = False) -> Path:
    """Requantise registered model ``name`` to ``quant``; the path of ``NAME@QUANT``
    (``NAME@QUANT-pure`` when ``pure`` or ``quant`` is a ``QUANT-pure`` tag).

    Without ``force`` an existing good variant is returned as is, and a damaged one
    raises (its message names the ``--force`` command); ``force`` rebuilds it."""
    if SEP in name:
        raise ModelError(f"prepare takes a registered model name, not a variant ({name!r}); "
                         f"e.g. `speclm models prepare {name.rpartition(SEP)[0]} --quant {quant}`")
    tag = quant_tag(quant, pure)
    quant, pure = parse_quant(tag)
    spec = get_spec(name)
    key = f"{name}{SEP}{tag}"
    dest = variant_path(key)
    if not force and dest.exists():
        return resolve_variant(key)  # good: reuse; damaged: CorruptModelError naming --force
    source = verify_model(name, full=False)  # assembled + verified (stamp fast path)
    with _locked(_lock_path(key), blocking=False,
                 busy=f"variant {key} is being prepared by another process; wait for it to finish"):
        for stale in _leftovers(key):
            stale.unlink(missing_ok=True)
        need = int(spec.size * QUANTS[quant][1] / 4.5 * 1.05)  # the sources are >= ~4.5 bits per weight
        free = shutil.disk_usage(dest.parent).free
        if free < need:
            raise ModelError(f"not enough disk space in {dest.parent} to prepare {key} (about {need} bytes "
                             f"needed, {free} free); free space or set SPECLM_CACHE_DIR")
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{key}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            took = _quantize(source, tmp, tag, n_threads)
            with open(tmp, "rb") as fh:
                magic = fh.read(4)
                os.fsync(fh.fileno())
            if magic != GGUF_MAGIC:
                raise ModelError(f"llama.cpp wrote {tmp} without a GGUF header while preparing {key}; "
                                 f"run `{_prepare_hint(name, tag, True)}` again")
            os.chmod(tmp, 0o644)
            sha = sha256_file(tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        st = dest.stat()
        _update_manifest(key, {
            "file": dest.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha,
            "source": name, "source_sha256": spec.sha256, "source_size": spec.size, "quant": quant,
            "pure": pure, "ftype": ftype(quant), "llama_cpp_python": _llama_cpp_version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(took, 2),
        })
    return dest


def _quantize(source: Path, out: Path, quant: str, n_threads: int | None) -> float:
    """Run llama.cpp's quantizer; ``quant`` is a tag (``q4_0`` or ``q4_0-pure``). Seconds taken."""
    from .quantize import quantize  # llama_lib's log callback keeps llama.cpp's chatter off stderr
    t0 = time.perf_counter()
    try:
        quantize(source, out, ftype(quant), n_threads, pure=parse_quant(quant)[1])
    except RuntimeError as exc:
        raise ModelError(f"llama.cpp could not requantise {source} to {quant}: {exc} "
                         f"(free disk space in {out.parent}: {shutil.disk_usage(out.parent).free} bytes)") from None
    return time.perf_counter() - t0


# ---- listing -------------------------------------------------------------------------
@dataclass
class VariantStatus:
    """One prepared (or half-prepared) variant. ``state``: ready | corrupt: <why> | unfinished."""

    name: str  # NAME@QUANT or NAME@QUANT-pure
    source: str
    quant: str  # the type alone (q4_0 for NAME@q4_0-pure)
    path: Path | None
    size: int | None
    state: str
    pure: bool = False  # head and token embedding quantised to `quant` too


def list_variants() -> list[VariantStatus]:
    """Variants recorded in the manifest or present in the cache dir, with their state (fast check)."""
    manifest = read_manifest()
    keys = set(manifest)
    cache = cache_dir()
    keys.update(p.name[:-len(".gguf")] for p in cache.glob(f"*{SEP}*.gguf"))
    keys.update(_part_key(p.name) for p in cache.glob(f".*{SEP}*.part"))
    rows = []
    for key in sorted(k for k in keys if k):
        try:
            name, tag = split_name(key)
        except ModelError:
            continue  # a stray file that is not one of ours
        quant, pure = parse_quant(tag)
        path = cache / f"{key}.gguf"
        entry = manifest.get(key)
        try:
            _check(key, full=False)
            state = "ready"
        except CorruptModelError as exc:
            state = "unfinished" if not path.exists() else f"corrupt: {getattr(exc, 'reason', exc)}"
        except ModelError as exc:
            if path.exists():
                state = str(exc)
            else:  # recorded but deleted, or another process is writing it now
                state = "being prepared" if _leftovers(key) else "missing"
        exists = path.exists()
        rows.append(VariantStatus(key, name, quant, path if exists else None,
                                  path.stat().st_size if exists else (entry or {}).get("size"), state, pure))
    return rows


def _part_key(filename: str) -> str:
    """``.NAME@QUANT.xxxx.part`` -> ``NAME@QUANT`` (names hold dots, quant tags do not)."""
    stem = filename[1:]
    name, sep, rest = stem.partition(SEP)
    return f"{name}{SEP}{rest.split('.', 1)[0]}" if sep else ""

