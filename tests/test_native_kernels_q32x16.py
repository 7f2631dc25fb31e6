"""speclm's X16 layout of the 32-value formats (quant_gemm_q32x16.cpp): sixteen rows' blocks stored
already transposed, read by the same tile kernels as ggml's layout. Its outputs must be the ggml-layout
kernels' bit for bit (every row count, every instruction set this CPU has, random and real tensors),
and inside llama.cpp `speclm-repack` (which keeps these weights in the layout and computes every matmul
on them, one-row decodes included) must give `speclm`'s logits for verify blocks where a model has only
these formats (the draft's Q4_K and Q6_K sum another way on X16: within the probe's tolerance) and stay
within the probe's tolerance of the plain kernels everywhere (Q4_1 and Q8_0, summed in ggml's order: bit
for bit)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from speclm import native
from speclm.backends import kernels as K
from tests.test_native_kernels import isas
from tests.test_native_kernels_q32 import (BLOCK_BYTES, TYPES, assert_close, draft_child, model_tensors,
                                           random_blocks, reference)

pytestmark = pytest.mark.skipif(native.library_path() is None, reason="speclm's kernels were not built here")

ROW_COUNTS = list(range(1, 65)) + [65, 130]


def same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.shape == b.shape, what
    diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    assert diff.size == 0, f"{what}: {diff.size} outputs differ, the first at {diff[0]}: {a.flat[diff[0]]} vs {b.flat[diff[0]]}"


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("k", [32, 96, 4128])
def test_the_layout_keeps_every_byte(weight_type, k):
    raw = random_blocks(weight_type, 48, k, np.random.default_rng(k))
    x16 = native.repack_x16(weight_type, raw, k)
    assert x16.shape == raw.shape and not np.array_equal(x16, raw)
    np.testing.assert_array_equal(native.repack_x16(weight_type, x16, k, back=True), raw)


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("k", [32, 96, 4128])
def test_every_row_count_gives_the_ggml_layouts_floats(weight_type, isa, k):
    rng = np.random.default_rng(3 * k)
    raw = random_blocks(weight_type, 48, k, rng)  # three groups of sixteen
    for ny in ROW_COUNTS:
        x = (rng.standard_normal((ny, k)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :32] = 0  # an all-zero activation block
        got = native.gemm(weight_type + "_x16", raw, k, x, isa)
        same_bits(got, native.gemm(weight_type, raw, k, x, isa), f"{weight_type} {isa} k={k} {ny} rows")
        if ny in (1, 4, 65):
            assert_close(got, reference(weight_type, raw, x), f"{weight_type} {isa} k={k} {ny} rows")


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it(weight_type, isa):
    # what keeps a one-row decode's logits equal to that row's in a verify block
    rng = np.random.default_rng(11)
    raw = random_blocks(weight_type, 32, 320, rng)
    x = rng.standard_normal((130, 320)).astype(np.float32)
    block = native.gemm(weight_type + "_x16", raw, 320, x, isa)
    for j in (0, 1, 63, 64, 65, 129):
        same_bits(native.gemm(weight_type + "_x16", raw, 320, x[j:j + 1], isa), block[j:j + 1],
                  f"{weight_type} {isa} row {j} of 130")


@pytest.mark.parametrize("isa", isas())
def test_extreme_blocks_give_the_ggml_layouts_floats(isa):
    rng = np.random.default_rng(5)
    x = np.where(rng.random((4, 64)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[1], x[2] = 1.0, -1.0
    for weight_type in TYPES:
        for fill in (0x00, 0xFF, 0x80, 0x88, 0x77):
            raw = np.full((16, 2 * BLOCK_BYTES[weight_type]), fill, dtype=np.uint8)
            raw.reshape(16, 2, -1)[:, :, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
            if weight_type == "q4_1":
                raw.reshape(16, 2, -1)[:, :, 2:4] = np.frombuffer(np.float16(-0.25).tobytes(), np.uint8)
            got = native.gemm(weight_type + "_x16", raw, 64, x, isa)
            same_bits(got, native.gemm(weight_type, raw, 64, x, isa), f"{weight_type} {isa} bytes {fill:#x}")
            assert_close(got, reference(weight_type, raw, x), f"{weight_type} {isa} bytes {fill:#x}")


def test_rows_off_the_group_size_are_refused():
    raw = random_blocks("q5_0", 24, 64, np.random.default_rng(6))
    with pytest.raises(ValueError, match="does not take q5_0 24x64"):
        native.repack_x16("q5_0", raw, 64)


@pytest.mark.parametrize("model,types", [("qwen2.5-coder-0.5b", {"q5_0", "q8_0"}), ("smollm2-135m", {"q4_1"})])
def test_real_tensors_of_the_small_models_give_the_ggml_layouts_floats(model, types):
    rng = np.random.default_rng(7)
    for name, weight_type, raw, k in model_tensors(model, types):
        raw = raw[:32]
        for ny in (1, 2, 4, 8, 16, 64, 80):
            x = rng.standard_normal((ny, k)).astype(np.float32)
            for isa in isas():
                same_bits(native.gemm(weight_type + "_x16", raw, k, x, isa), native.gemm(weight_type, raw, k, x, isa),
                          f"{model} {name} {isa} {ny} rows")


LOAD_LOG = """
import sys
from speclm.backends import kernels as K
from speclm.backends.llamacpp import LlamaCppBackend
from speclm.models.catalog import resolve_model
config, model = K.parse_config(sys.argv[1]), sys.argv[2]
K.apply(config, model)
LlamaCppBackend(resolve_model(model), n_ctx=256, n_threads=2, n_seq_max=1, kernels=config)
"""


@pytest.mark.slow
def test_a_tied_embedding_stays_in_ggmls_layout_and_its_output_copy_is_repacked():
    # SmolLM2's output head is its token embedding (Q8_0): llama.cpp loads the tensor twice, once for
    # GET_ROWS (which CPU_SPECLM_X16 declines: ggml's CPU buffer) and once, TENSOR_DUPLICATED, for the
    # head's MUL_MAT (ours)
    if K.build_info().unavailable("speclm-repack"):
        pytest.skip(K.build_info().unavailable("speclm-repack"))
    env = dict(os.environ, SPECLM_LLAMA_LOG="1")
    env.pop(K.TILED_ENV, None)
    proc = subprocess.run([sys.executable, "-c", LOAD_LOG, "speclm-repack+tiled", "smollm2-135m"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stderr
    assert log.count("loading tensor token_embd.weight") == 2, "the tied head is loaded as a second tensor"
    assert "tensor 'token_embd.weight' (q8_0)" in log and "using CPU instead" in log
    assert "CPU_SPECLM_X16 model buffer size" in log
    # on `speclm` the same weights keep ggml's layout (CPU_SPECLM)
    proc = subprocess.run([sys.executable, "-c", LOAD_LOG, "speclm+tiled", "smollm2-135m"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CPU_SPECLM model buffer size" in proc.stderr
    assert "CPU_SPECLM_X16 model buffer size" not in proc.stderr


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    if K.build_info().unavailable("speclm-repack"):
        pytest.skip(K.build_info().unavailable("speclm-repack"))
    root = tmp_path_factory.mktemp("x16")
    runs = {}
    for model in ("qwen2.5-coder-0.5b", "smollm2-135m"):
        runs[model, "plain+tiled"] = draft_child("plain+tiled", root / f"{model}-plain", model=model)
        runs[model, "speclm+tiled"] = draft_child("speclm+tiled", root / f"{model}-speclm", model=model)
        for isa in isas():
            runs[model, isa] = draft_child("speclm-repack+tiled", root / f"{model}-{isa}", isa, model=model)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "smollm2-135m"])
@pytest.mark.parametrize("isa", isas())
def test_inside_llama_cpp_verify_blocks_give_speclms_logits(small_runs, model, isa):
    from speclm.backends.probe import compare_logits
    got, info = small_runs[model, isa]
    want, _ = small_runs[model, "speclm+tiled"]
    assert info["status"].startswith(isa), info
    names = [f"block{b}" for b in (2, 4, 16)]
    if model == "smollm2-135m":  # only 32-value formats: the same kernels on either layout
        for name in names:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    else:  # the draft's Q4_K and Q6_K weights sum another way on X16 (test_native_kernels_k16.py)
        assert compare_logits({n: want[n] for n in names}, {n: got[n] for n in names}) is None
    for b in (4, 16):  # a row's logits do not depend on the block verifying it
        np.testing.assert_array_equal(got[f"block{b}"][:2], got["block2"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b", "smollm2-135m"])
@pytest.mark.parametrize("isa", isas())
def test_inside_llama_cpp_decodes_and_long_prefills_run_on_the_layout(small_runs, model, isa):
    # ggml cannot read the layout, so the one-row decodes and the 80-row prefill run speclm's kernels too
    from speclm.backends.probe import compare_logits
    got, info = small_runs[model, isa]
    want, _ = small_runs[model, "plain+tiled"]
    assert info["handled"]["declined"] > 0, info
    names = ["prefill", "decode1", "decode2"]
    if model == "smollm2-135m":  # Q4_1 layers and the tied Q8_0 head, in ggml's order: ggml's floats
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    else:
        rows = lambda run: {n: np.atleast_2d(run[n]) for n in names}  # one row of logits each
        assert compare_logits(rows(want), rows(got)) is None
