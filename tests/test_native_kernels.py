"""speclm's own matmul kernels compute W . x exactly as the formats define it: against a
straightforward reference (dequantise the weights with gguf's reference code, quantise the
activations as ggml's Q8_K does, multiply in float64) over random blocks, odd shapes, every
row count 1..64 and beyond, each instruction set this CPU has, and real tensors of both
shipped models. Inside llama.cpp they claim only what a `speclm` configuration loads, their
logits match the plain kernels' within the probe's tolerance, a row's logits do not depend on
the block it is verified in, and a process where they cannot register runs without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize

from speclm import native
from speclm.backends import kernels as K

TYPES = {"q4_K": T.Q4_K, "q6_K": T.Q6_K}
BLOCK_BYTES = {"q4_K": 144, "q6_K": 210}

pytestmark = pytest.mark.skipif(native.library_path() is None, reason="speclm's kernels were not built here")


def isas() -> list[str]:
    """The kernels this CPU can run (AVX2 on every x86-64 with it; AVX-512 VNNI where present)."""
    from speclm.machine import cpu_flags
    flags = set(cpu_flags())
    found = ["avx2"] if {"avx2", "fma", "f16c"} <= flags else []
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        found.append("avx512-vnni")
    return found


def q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref, then dequantised: per 256 values d = max / -127 (max: the value
    of largest magnitude, sign kept), q = min(127, round_half_even(x / d))."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    big = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(big != 0, np.float32(-127.0) / big, np.float32(0)).astype(np.float32)
        q = np.minimum(127, np.rint((iscale * blocks).astype(np.float32)))
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    return (q * d).reshape(x.shape)


def reference(weight_type: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    w = dequantize(raw, TYPES[weight_type]).reshape(raw.shape[0], -1).astype(np.float64)
    return q8_k(x).astype(np.float64) @ w.T


def random_blocks(weight_type: str, rows: int, k: int, rng) -> np.ndarray:
    """Random bytes for every field, with finite f16 scales of a plausible size."""
    nb = k // 256
    raw = rng.integers(0, 256, size=(rows, nb, BLOCK_BYTES[weight_type]), dtype=np.uint8)
    f16 = lambda: (rng.standard_normal((rows, nb)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if weight_type == "q4_K":
        raw[:, :, 0:2], raw[:, :, 2:4] = f16(), np.abs(f16().view(np.float16)).view(np.uint8)
    else:
        raw[:, :, 208:210] = f16()
    return raw.reshape(rows, nb * BLOCK_BYTES[weight_type])


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    # exact integer dots; only the float sums over blocks are ordered differently
    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-12))
    assert err < 2e-6, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
def test_every_row_count_matches_the_reference(weight_type, isa):
    rng = np.random.default_rng(1)
    raw = random_blocks(weight_type, 9, 512, rng)
    for ny in list(range(1, 65)) + [65, 130]:
        x = rng.standard_normal((ny, 512)).astype(np.float32)
        assert_close(native.gemm(weight_type, raw, 512, x, isa), reference(weight_type, raw, x),
                     f"{weight_type} {isa} {ny} rows")


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("rows,k", [(1, 256), (2, 256), (3, 768), (37, 1536), (5, 8960)])
def test_odd_shapes_match_the_reference(weight_type, isa, rows, k):
    rng = np.random.default_rng(rows * k)
    raw = random_blocks(weight_type, rows, k, rng)
    for ny in (1, 3, 16):
        x = (rng.standard_normal((ny, k)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :256] = 0  # an all-zero activation block (Q8_K's d = 0)
        assert_close(native.gemm(weight_type, raw, k, x, isa), reference(weight_type, raw, x),
                     f"{weight_type} {isa} {rows}x{k}, {ny} rows")



@pytest.mark.parametrize("isa", isas())
def test_activations_round_halves_to_even_and_take_the_first_largest_value(isa):
    # d = 1 exactly (the largest magnitude is -127, first of a tie with +127), so every x + 0.5 lands
    # on a half: rounding away from zero would move each such value by 1
    rng = np.random.default_rng(11)
    x = (rng.integers(-126, 126, size=(3, 512)) + 0.5).astype(np.float32)
    x[:, 0], x[:, 1], x[:, 256], x[:, 300] = -127, 127, 127, -127
    for weight_type in TYPES:
        raw = random_blocks(weight_type, 8, 512, rng)
        assert_close(native.gemm(weight_type, raw, 512, x, isa), reference(weight_type, raw, x), f"{weight_type} {isa}")


def shipped_tensors(model: str) -> list[tuple[str, str, np.ndarray, int]]:
    """(name, type, the first 48 rows' raw bytes, K) of each Q4_K/Q6_K matmul weight kind of a shipped model."""
    from speclm.models.catalog import resolve_model
    reader = GGUFReader(resolve_model(model))
    found, kinds = [], set()
    for t in reader.tensors:
        kind = (t.name.split(".")[-2], t.tensor_type.name)
        if t.tensor_type.name.lower() not in (n.lower() for n in TYPES) or kind in kinds or t.name == "token_embd.weight":
            continue
        kinds.add(kind)
        k = int(t.shape[0])
        raw = np.asarray(t.data).reshape(int(t.shape[1]), -1)[:48]
        found.append((t.name, "q4_K" if t.tensor_type == T.Q4_K else "q6_K", raw, k))
    return found


@pytest.mark.parametrize("model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_real_tensors_of_the_shipped_models_match_the_reference(model):
    rng = np.random.default_rng(7)
    tensors = shipped_tensors(model)
    assert {t for _, t, _, _ in tensors} == set(TYPES), f"{model} has both Q4_K and Q6_K matmul weights"
    for name, weight_type, raw, k in tensors:
        for ny in (1, 2, 4, 7, 16, 64):
            x = rng.standard_normal((ny, k)).astype(np.float32)
            want = reference(weight_type, raw, x)
            for isa in isas():
                got = native.gemm(weight_type, raw, k, x, isa)
                assert_close(got, want, f"{model} {name} {isa} {ny} rows")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_a_process_without_the_library_runs_on_llama_cpps_kernels():
    proc = run_python("from speclm.backends import kernels as K\n"
                      "b = K.build_info()\n"
                      "print(b.speclm)\n"
                      "print(sorted({c.buffers for c in b.configs()}))", SPECLM_NATIVE="0")
    assert proc.returncode == 0, proc.stderr
    reason, families = proc.stdout.strip().splitlines()
    assert reason == "SPECLM_NATIVE=0 is set"
    assert "speclm" not in families and "speclm-repack" not in families and "plain" in families


def test_an_install_that_could_not_build_them_says_so(monkeypatch):
    monkeypatch.setattr(native, "library_path", lambda: None)
    assert "were not built by the install" in native._load()


def test_a_bad_row_range_turns_them_off_with_the_reason():
    proc = run_python("from speclm.backends import kernels as K\nprint(K.build_info().speclm)",
                      SPECLM_NATIVE_ROWS="8-2")
    assert proc.returncode == 0, proc.stderr
    assert "SPECLM_NATIVE_ROWS='8-2'" in proc.stdout and "1 <= LO <= HI" in proc.stdout


def test_kernels_that_register_after_a_model_load_refuse_and_say_why():
    # llama.cpp copies its list of buffer types at the first model load: registering later would
    # leave a buffer type it never offers, so the library takes itself back out
    code = ("import llama_cpp as L\n"
            "from speclm.models.catalog import resolve_model\n"
            "L.llama_backend_init()\n"
            "m = L.llama_model_load_from_file(str(resolve_model('smollm2-135m')).encode(), L.llama_model_default_params())\n"
            "assert m\n"
            "from speclm.backends import kernels as K\n"
            "print(K.build_info().speclm)")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "a model was loaded before speclm's kernels registered" in proc.stdout


@pytest.fixture(scope="module")
def target_pair():
    """The shipped target loaded twice in this process: on speclm's kernels and on the plain ones."""
    from speclm.backends.llamacpp import LlamaCppBackend
    from speclm.models.catalog import resolve_model
    path = resolve_model("qwen2.5-coder-1.5b")
    if not native.status().available and K.build_info().speclm is not None:
        pytest.skip(K.build_info().speclm)
    ours = LlamaCppBackend(path, n_ctx=256, n_threads=2, n_seq_max=1, kernels=K.parse_config("speclm"))
    plain = LlamaCppBackend(path, n_ctx=256, n_threads=2, n_seq_max=1, kernels=K.parse_config("plain"))
    yield ours, plain
    ours.close()
    plain.close()


@pytest.fixture(scope="module")
def interleaved_target():
    """The shipped target on `speclm-repack`: its Q4_K and Q6_K weights in speclm's X16 layout."""
    from speclm.backends.llamacpp import LlamaCppBackend
    from speclm.models.catalog import resolve_model
    if K.build_info().unavailable("speclm-repack"):
        pytest.skip(K.build_info().unavailable("speclm-repack"))
    backend = LlamaCppBackend(resolve_model("qwen2.5-coder-1.5b"), n_ctx=256, n_threads=2, n_seq_max=1,
                              kernels=K.parse_config("speclm-repack"))
    yield backend
    backend.close()


def scores(backend, tokens: list[int], blocks) -> dict[int, np.ndarray]:
    seq = backend.new_sequence()
    backend.prefill(seq, tokens[:24])
    out = {}
    for b in blocks:
        out[b] = backend.score(seq, tokens[24:24 + b])
        backend.rollback(seq, 24)
    backend.free(seq)
    return out


@pytest.mark.slow
def test_inside_llama_cpp_they_compute_the_verify_blocks_and_agree_with_the_plain_kernels(target_pair):
    from speclm.backends.probe import compare_logits
    ours, plain = target_pair
    text = "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n" * 8
    tokens = ours.tokenize(text, add_special=False)
    lo, hi = native.rows_range()
    blocks = (1, 2, 3, 4, 8, 16, 17, 33, 64)
    before = native.handled()
    got = scores(ours, tokens, blocks)
    assert native.handled() - before >= 28 * 4 * len([b for b in blocks if lo <= b <= hi]), \
        "speclm's kernels computed the layers' matmuls of every block in their row range"
    want = scores(plain, tokens, blocks)
    assert compare_logits({str(b): v for b, v in want.items()}, {str(b): v for b, v in got.items()}) is None
    # a row's logits are the same whichever block (in the kernels' range) verifies it; at 64 rows
    # llama.cpp's own attention kernels change their path, so the claim stops at a 33-row block
    inside = [b for b in blocks if lo <= b <= min(hi, 33)]
    for b in inside[1:]:
        np.testing.assert_array_equal(got[b][:inside[0]], got[inside[0]][:b])


@pytest.mark.slow
def test_on_the_x16_layout_every_forward_runs_speclms_kernels_and_agrees_with_the_plain_kernels(
        target_pair, interleaved_target):
    # `speclm-repack` keeps the Q4_K and Q6_K weights in speclm's X16 layout, which ggml cannot read:
    # every matmul on them runs speclm's kernels, one-row decodes and prefills past 64 rows included
    from speclm.backends.probe import compare_logits
    _, plain = target_pair
    ours = interleaved_target
    text = "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n" * 8
    tokens = ours.tokenize(text, add_special=False)
    blocks = (1, 2, 3, 4, 8, 16, 17, 33, 64)
    before = native.handled()
    got = scores(ours, tokens, blocks)
    # q, k, v, o, gate, up, down in 28 layers and the head, for the prefill and every block
    assert native.handled() - before >= (28 * 7 + 1) * (len(blocks) + 1)
    want = scores(plain, tokens, blocks)
    assert compare_logits({str(b): v for b, v in want.items()}, {str(b): v for b, v in got.items()}) is None
    # a row's logits are the same whichever block verifies it, from one row up (below 64 rows, where
    # llama.cpp's own attention kernels change their path)
    for b in blocks[1:-1]:
        np.testing.assert_array_equal(got[b][:1], got[1], err_msg=f"row 0 alone and in a block of {b}")
    seq = ours.new_sequence()
    before = native.handled()
    ours.prefill(seq, tokens[:80])
    assert native.handled() - before >= 28 * 7 + 1, "an 80-token prefill ran on speclm's kernels"
    ours.free(seq)
