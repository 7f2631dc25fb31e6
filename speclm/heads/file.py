"""Heads files: where they live, how they are written, and the checks on load.

A heads file is an .npz holding W (float16), b, vocab_ids and a JSON `meta`
(format, target sha256, hidden size, vocabulary size, training facts). The
output matrix is NOT stored: it is read from the target GGUF (`gguf` package)
and dequantised at load, so the file stays small and cannot disagree with the
target. Next to it, `<file>.sha256` holds the file's own sha256: a corrupt or
edited file is refused, as is a file trained for another target.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..errors import ModelError
from ..models.store import sha256_file as file_sha256
from .model import MedusaHeads

FORMAT = "speclm-medusa-heads/1"
PACKAGED = Path(__file__).parent / "data"  # heads shipped with speclm, named <target sha256[:16]>.npz


def target_sha256(path: str | Path) -> str:
    """sha256 of a target GGUF, remembered in the cache by (path, size, mtime)."""
    from ..models.store import cache_dir
    path = Path(path).resolve()
    st = path.stat()
    stamp = cache_dir() / "heads" / f"sha-{hashlib.sha1(str(path).encode()).hexdigest()[:12]}.json"
    try:
        data = json.loads(stamp.read_text())
        if data["size"] == st.st_size and data["mtime_ns"] == st.st_mtime_ns:
            return data["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    sha = file_sha256(path)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha, "path": str(path)}))
    return sha


def default_heads_path(target_sha: str) -> Path:
    """Where `speclm heads train` writes the heads of the target with this sha256."""
    from ..models.store import cache_dir
    return cache_dir() / "heads" / f"{target_sha[:16]}.npz"


def find_heads(target_sha: str) -> Path | None:
    """The trained heads for this target: the cache first, then the ones shipped with speclm."""
    for path in (default_heads_path(target_sha), PACKAGED / f"{target_sha[:16]}.npz"):
        if path.is_file():
            return path
    return None


def output_matrix(gguf_path: str | Path, token_ids: np.ndarray) -> np.ndarray:
    """Rows `token_ids` of the target's output matrix (output.weight, or the tied token
    embedding), dequantised to float32 (len(token_ids), d)."""
    import gguf
    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise ModelError(f"{gguf_path} has neither output.weight nor token_embd.weight: not a language model GGUF")
    rows = np.asarray(t.data)[np.asarray(token_ids, dtype=np.int64)]
    return np.asarray(gguf.quants.dequantize(rows, t.tensor_type), dtype=np.float32)


def save_heads(heads: MedusaHeads, path: Path) -> str:
    """Write heads (atomically) and their sha256 sidecar; returns the sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**heads.meta, "format": FORMAT, "target_sha256": heads.target_sha256,
            "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "n_heads": heads.n_heads}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, W=heads.W.astype(np.float16), b=heads.b, vocab_ids=heads.vocab_ids,
             meta=np.array(json.dumps(meta)))
    sha = file_sha256(tmp)
    os.replace(tmp, path)
    Path(str(path) + ".sha256").write_text(sha + "\n")
    return sha


def read_heads_meta(path: Path) -> dict:
    """The meta of a heads file, after checking its sha256 sidecar and format."""
    if not path.is_file():
        raise ModelError(f"no heads file at {path}: train one with `speclm heads train --target NAME`")
    side = Path(str(path) + ".sha256")
    if not side.is_file():
        raise ModelError(f"{path} has no {side.name} next to it, so it cannot be checked: "
                         f"retrain with `speclm heads train` or restore the file")
    if file_sha256(path) != side.read_text().strip():
        raise ModelError(f"{path} does not match its sha256 ({side.name}): the file is corrupt or was "
                         f"edited; retrain with `speclm heads train --target NAME`")
    try:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{path} is not a speclm heads file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise ModelError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}: retrain it")
    return meta


def load_heads(path: Path, gguf_path: str | Path, hidden_size: int, vocab_size: int,
               target_sha: str | None = None) -> MedusaHeads:
    """Heads for the target at gguf_path; ModelError if the file is corrupt or was
    trained for another target or another shape."""
    meta = read_heads_meta(path)
    target_sha = target_sha or target_sha256(gguf_path)
    if meta["target_sha256"] != target_sha:
        raise ModelError(f"{path} was trained for target sha256 {meta['target_sha256'][:12]}…, not for "
                         f"{Path(gguf_path).name} ({target_sha[:12]}…): train heads for this target with "
                         f"`speclm heads train --target NAME`")
    if meta["hidden_size"] != hidden_size or meta["vocab_size"] != vocab_size:
        raise ModelError(f"{path} has hidden size {meta['hidden_size']} and vocabulary {meta['vocab_size']}, "
                         f"the target {hidden_size} and {vocab_size}: these heads belong to another model")
    with np.load(path) as z:
        W, b, ids = z["W"].astype(np.float32), z["b"], z["vocab_ids"]
    if W.shape[1:] != (hidden_size, hidden_size):
        raise ModelError(f"{path}: W has shape {W.shape}, expected (K, {hidden_size}, {hidden_size})")
    return MedusaHeads(W, b, output_matrix(gguf_path, ids), ids, vocab_size, target_sha, meta)
