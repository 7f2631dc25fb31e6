"""Requantised variants (`speclm models prepare`) and `speclm models compare`.

Runs on the embedded SmolLM2-135M (98 MB): q8_0 and q4_0 are prepared once
into a private cache dir (SPECLM_CACHE_DIR), never the real cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from speclm.errors import ModelError
from speclm.backends.probe import LOGIT_TOLERANCE
from speclm.commands import models as cli
from speclm.models import catalog, store, variants
from speclm.models.store import CorruptModelError

SMOL = "smollm2-135m"
Q8, Q4 = f"{SMOL}@q8_0", f"{SMOL}@q4_0"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding smollm2-135m@q8_0 and @q4_0 (prepared once per module)."""
    cache = tmp_path_factory.mktemp("variants-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLM_CACHE_DIR", str(cache))
        for quant in ("q8_0", "q4_0"):
            variants.prepare_variant(SMOL, quant, n_threads=1)
    return cache


@pytest.fixture
def cache(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared prepared cache (tests using it must not damage it)."""
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(prepared))
    return prepared


@pytest.fixture
def scratch(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the prepared cache (q4_0 + manifest), free to damage."""
    dest = tmp_path / "cache"
    dest.mkdir()
    for name in (f"{Q4}.gguf", variants.MANIFEST):
        shutil.copy2(prepared / name, dest / name)  # copy2 keeps mtime_ns: the fast path still holds
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(dest))
    return dest


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="speclm")
    cli.add_models_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def flip_byte(path: Path, offset: int = 1_000_000) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


# ---- prepare / manifest / resolve -------------------------------------------------
def test_prepared_files_match_their_manifest(cache: Path) -> None:
    manifest = variants.read_manifest()
    assert set(manifest) == {Q8, Q4}
    for key in (Q8, Q4):
        path = cache / f"{key}.gguf"
        entry = manifest[key]
        assert path.is_file() and path.read_bytes()[:4] == b"GGUF"
        assert entry["size"] == path.stat().st_size
        assert entry["sha256"] == store.sha256_file(path)
        assert entry["source"] == SMOL and entry["source_sha256"] == store.get_spec(SMOL).sha256
        assert entry["quant"] == key.split("@")[1] and entry["llama_cpp_python"]
        assert catalog.resolve_model(key) == path == variants.resolve_variant(key)
    assert not list(cache.glob("*.part")) and not list(cache.glob(".*.part"))
    # q4_0 is smaller than q8_0; a prepare of a good variant is a no-op
    assert (cache / f"{Q4}.gguf").stat().st_size < (cache / f"{Q8}.gguf").stat().st_size
    before = (cache / f"{Q4}.gguf").stat().st_mtime_ns
    assert variants.prepare_variant(SMOL, "Q4_0") == cache / f"{Q4}.gguf"
    assert (cache / f"{Q4}.gguf").stat().st_mtime_ns == before


def test_variants_load_and_generate(cache: Path) -> None:
    from speclm import LLM, SamplingParams, SpecConfig
    from speclm.backends.llamacpp import LlamaCppBackend

    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    with LLM(target=Q8, n_ctx=256, n_threads=1) as llm:  # by derived name, through resolve_model
        assert Path(llm.target.path) == cache / f"{Q8}.gguf"
        out = llm.generate("def add(a, b):", params, SpecConfig(method="ar"))
        assert len(out.token_ids) == 8
    backend = LlamaCppBackend(variants.resolve_variant(Q4), n_ctx=256, n_threads=1, n_seq_max=1)
    try:
        out = LLM(target=backend).generate("def add(a, b):", params, SpecConfig(method="ar"))
        assert len(out.token_ids) == 8 and out.text
    finally:
        backend.close()


def test_list_models_and_list_variants_show_variants(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {v.name: v for v in variants.list_variants()}
    assert rows[Q4].state == rows[Q8].state == "ready" and rows[Q4].quant == "q4_0"
    states = {s.name: s.state for s in catalog.list_models()}
    assert states[Q4] == "ready" and states[SMOL] == "ready"
    assert run_cli("models", "list") == 0
    out = capsys.readouterr().out
    assert Q4 in out and Q8 in out
    assert run_cli("models", "verify", Q4) == 0
    assert f"OK       {Q4}" in capsys.readouterr().out


def test_missing_unknown_and_bad_names(cache: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelError, match=r"run `speclm models prepare smollm2-135m --quant q5_0`"):
        catalog.resolve_model(f"{SMOL}@q5_0")
    for call in (lambda: variants.prepare_variant(SMOL, "q3_x"), lambda: catalog.resolve_model(f"{SMOL}@q3_x")):
        with pytest.raises(ModelError, match=r"unknown quantisation type 'q3_x'; choose one of: q4_0, q4_1, "
                                             r"q5_0, q5_1, q8_0, q4_k_m, q5_k_m, q6_k, iq4_nl"):
            call()
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        variants.prepare_variant("nope", "q4_0")
    with pytest.raises(ModelError, match="not a variant"):
        variants.prepare_variant(Q4, "q4_0")
    from speclm.commands import main
    assert main(["models", "prepare", SMOL, "--quant", "iq2_xxs"]) == 1
    out, err = capfd.readouterr()
    assert err.startswith("speclm: error: unknown quantisation type 'iq2_xxs'; choose one of:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---- damage is detected, and --force repairs it ------------------------------------
def test_truncated_file_is_detected_and_rebuilt_by_force(scratch: Path) -> None:
    path = scratch / f"{Q4}.gguf"
    good_sha = variants.read_manifest()[Q4]["sha256"]
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    for resolve in (variants.resolve_variant, catalog.resolve_model):
        with pytest.raises(CorruptModelError) as exc:
            resolve(Q4)
        msg = str(exc.value)
        assert str(path) in msg and "truncated" in msg
        assert "`speclm models prepare smollm2-135m --quant q4_0 --force`" in msg
    from speclm import LLM
    with pytest.raises(ModelError, match="truncated"):
        LLM(target=Q4, n_ctx=256, n_threads=1)
    with pytest.raises(CorruptModelError, match="--force"):
        variants.prepare_variant(SMOL, "q4_0")  # no silent overwrite without --force
    assert variants.prepare_variant(SMOL, "q4_0", force=True, n_threads=1) == path
    assert store.sha256_file(path) == good_sha == variants.read_manifest()[Q4]["sha256"]
    assert variants.resolve_variant(Q4) == path


def test_flipped_byte_is_detected_and_rebuilt_by_cli_force(scratch: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = scratch / f"{Q4}.gguf"
    st = path.stat()
    flip_byte(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert variants.resolve_variant(Q4) == path  # same size + mtime: the fast path trusts the record
    assert run_cli("models", "verify", Q4) == 1  # ... a full verify does not
    assert "sha256 mismatch" in capsys.readouterr().out
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    with pytest.raises(CorruptModelError, match=r"sha256 mismatch.*--quant q4_0 --force") as exc:
        catalog.resolve_model(Q4)
    assert str(path) in str(exc.value)
    assert {v.name: v.state for v in variants.list_variants()}[Q4].startswith("corrupt: sha256 mismatch")
    assert run_cli("models", "prepare", SMOL, "--quant", "q4_0", "--force", "--threads", "1") == 0
    assert capsys.readouterr().out.strip() == f"{Q4}  {path}"
    assert variants.verify_variant(Q4) == path


def test_verify_repair_rebuilds_a_variant(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scratch / f"{Q4}.gguf"
    flip_byte(path)  # mtime changes: fast path rehashes
    assert run_cli("models", "verify", Q4, "--repair") == 0
    assert f"REPAIRED {Q4}" in capsys.readouterr().out
    assert variants.resolve_variant(Q4) == path


def test_interrupted_prepare_leaves_no_variant_and_is_reported(scratch: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = scratch / f"{Q4}.gguf"
    path.unlink()

    def killed(source, out, quant, n_threads):
        out.write_bytes(b"GGUF partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(variants, "_quantize", killed)
    with pytest.raises(KeyboardInterrupt):
        variants.prepare_variant(SMOL, "q4_0")
    assert not path.exists() and not list(scratch.glob(".*.part"))  # the temp file is cleaned up
    monkeypatch.undo()
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(scratch))
    leftover = scratch / f".{Q4}.x1y2z3.part"  # what a SIGKILL would leave
    leftover.write_bytes(b"GGUF partial")
    with pytest.raises(CorruptModelError) as exc:
        catalog.resolve_model(Q4)
    msg = str(exc.value)
    assert "interrupted" in msg and str(leftover) in msg and "--quant q4_0 --force" in msg
    assert {v.name: v.state for v in variants.list_variants()}[Q4] == "unfinished"
    assert variants.prepare_variant(SMOL, "q4_0", force=True, n_threads=1) == path
    assert not leftover.exists() and variants.resolve_variant(Q4) == path


def test_unrecorded_or_stale_source_variant_is_refused(scratch: Path) -> None:
    manifest = scratch / variants.MANIFEST
    data = json.loads(manifest.read_text())
    data["variants"][Q4]["source_sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    with pytest.raises(CorruptModelError, match=r"another version of smollm2-135m.*--force"):
        variants.resolve_variant(Q4)
    manifest.write_text("{ not json")
    with pytest.raises(CorruptModelError, match=r"not recorded in .*variants\.json.*--force"):
        variants.resolve_variant(Q4)


# ---- compare ------------------------------------------------------------------------
def test_compare_produces_every_field(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("models", "compare", SMOL, Q8, Q4, "--texts", "1", "--k-max", "4", "--threads", "1",
                   "--ar-tokens", "8", "--json", "--quiet") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["reference"] == SMOL and result["ks"] == [1, 2, 3, 4]
    assert result["texts"]["labels"][-1] == "HumanEval/0" and result["texts"]["tokens"] > 500
    assert len(result["loadavg_before"]) == 3 and len(result["loadavg_after"]) == 3
    assert isinstance(result["warnings"], list) and result["threads"] == 1
    ref, q8, q4 = result["models"]
    assert [m["name"] for m in result["models"]] == [SMOL, Q8, Q4]
    for m in result["models"]:
        assert m["size"] == Path(m["path"]).stat().st_size
        assert 1.0 < m["perplexity"] < 100 and m["ppl_tokens"] == ref["ppl_tokens"] > 500
        assert 0.5 < m["agreement"] <= 1.0
        assert m["ar_tok_s"] > 0 and m["ar_tokens"] == 16 and len(m["ar_same_prefix"]) == 2
        assert set(m["v_ms"]) == {"1", "2", "3", "4"} and all(v > 0 for v in m["v_ms"].values())
        assert all(len(t) == 3 for t in m["v_ms_all"].values())
        assert m["batch_noise"] < LOGIT_TOLERANCE and m["batch_noise_k"] == 4  # sound kernels: 4 rows ~ 4 x 1 row
    assert ref["agreement"] == 1.0 and ref["ar_same_prefix"] == [8, 8]
    assert "Q8_0" in q8["type"] and "Q4_0" in q4["type"]
    assert q8["agreement"] > q4["agreement"]  # 8-bit stays closer to the shipped Q4_1 than 4-bit does
    from speclm.bench.analysis.model_compare import print_table
    print_table(result)
    table = capsys.readouterr().out
    assert "v(4) ms" in table and "perplexity" in table and "load average" in table


# ---- pure variants: the output head and token embedding quantised too --------------
Q4P = f"{SMOL}@q4_0-pure"
GGML_F32, GGML_Q4_0 = 0, 2  # ggml_type ids


def gguf_tensor_types(path: Path) -> dict[str, int]:
    """{tensor name: ggml type id} read from a GGUF file's header (format v2/v3)."""
    import struct
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as fh:
        def read(fmt: str):
            return struct.unpack("<" + fmt, fh.read(struct.calcsize("<" + fmt)))[0]

        def string() -> str:
            return fh.read(read("Q")).decode()

        def value(kind: int) -> None:
            if kind == 8:
                string()
            elif kind == 9:
                item, n = read("I"), read("Q")
                for _ in range(n):
                    value(item)
            else:
                read(scalars[kind])
        assert fh.read(4) == b"GGUF"
        read("I")
        n_tensors, n_kv = read("Q"), read("Q")
        for _ in range(n_kv):
            string()
            value(read("I"))
        types = {}
        for _ in range(n_tensors):
            name = string()
            for _ in range(read("I")):
                read("Q")
            types[name] = read("I")
            read("Q")
        return types


def test_pure_names_parse_round_trip_and_hint_at_the_pure_flag(cache: Path) -> None:
    assert variants.derived_name(SMOL, "Q4_0", pure=True) == Q4P == variants.derived_name(SMOL, "q4_0-PURE")
    assert variants.derived_name(SMOL, "q4_0") == Q4
    assert variants.split_name(f"{SMOL}@Q4_0-Pure") == (SMOL, "q4_0-pure")
    assert variants.parse_quant("q4_0-pure") == ("q4_0", True) and variants.parse_quant("Q8_0") == ("q8_0", False)
    with pytest.raises(ModelError, match="unknown quantisation type"):
        variants.split_name(f"{SMOL}@q4_0-impure")
    with pytest.raises(ModelError, match=r"run `speclm models prepare smollm2-135m --quant q5_0 --pure`"):
        catalog.resolve_model(f"{SMOL}@q5_0-pure")


def test_pure_variant_is_prepared_listed_resolved_verified_and_differs(scratch: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`prepare --pure` writes NAME@QUANT-pure, where every quantised tensor, the
    token embedding (SmolLM2's tied output head) included, is QUANT."""
    assert run_cli("models", "prepare", SMOL, "--quant", "Q4_0", "--pure", "--threads", "1") == 0
    path, plain_path = scratch / f"{Q4P}.gguf", scratch / f"{Q4}.gguf"
    assert capsys.readouterr().out.strip() == f"{Q4P}  {path}"
    manifest = variants.read_manifest()
    entry = manifest[Q4P]
    assert (entry["quant"], entry["pure"], entry["file"]) == ("q4_0", True, path.name)
    assert entry["sha256"] == store.sha256_file(path) != manifest[Q4]["sha256"]
    # resolvable by name (any case), listed, verified; the plain variant is untouched
    assert catalog.resolve_model(Q4P) == catalog.resolve_model(f"{SMOL}@Q4_0-PURE") == path
    assert variants.prepare_variant(SMOL, "q4_0", pure=True) == path  # a good one is reused
    rows = {v.name: v for v in variants.list_variants()}
    assert (rows[Q4P].quant, rows[Q4P].pure, rows[Q4P].state) == ("q4_0", True, "ready")
    assert (rows[Q4].quant, rows[Q4].pure, rows[Q4].state) == ("q4_0", False, "ready")
    assert run_cli("models", "list") == 0 and Q4P in capsys.readouterr().out
    assert run_cli("models", "verify", Q4P, Q4) == 0
    assert f"OK       {Q4P}" in capsys.readouterr().out
    # it differs from the plain variant where it should: the embedding is q4_0, not kept higher
    pure, plain = gguf_tensor_types(path), gguf_tensor_types(plain_path)
    assert set(pure) == set(plain)
    assert {t for t in pure.values() if t != GGML_F32} == {GGML_Q4_0}
    assert plain["token_embd.weight"] != GGML_Q4_0 == pure["token_embd.weight"]
    assert path.stat().st_size < plain_path.stat().st_size
    from speclm import LLM, SamplingParams, SpecConfig
    with LLM(target=Q4P, n_ctx=256, n_threads=1) as llm:
        out = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=4, ignore_eos=True), SpecConfig(method="ar"))
        assert len(out.token_ids) == 4
    # damage names the pure rebuild; verify --repair rebuilds it pure
    flip_byte(path)
    with pytest.raises(CorruptModelError, match=r"--quant q4_0 --pure --force"):
        catalog.resolve_model(Q4P)
    assert run_cli("models", "verify", Q4P, "--repair") == 0
    assert f"REPAIRED {Q4P}" in capsys.readouterr().out
    assert store.sha256_file(path) == entry["sha256"] and variants.read_manifest()[Q4P]["pure"] is True
