"""speclm's X16 layout of Q4_K and Q6_K (quant_gemm_k16.cpp): sixteen rows' blocks interleaved so a
register lane holds one weight row. Its kernels sum each block exactly in integers and then add it in
float one row and one block at a time, so they must match the dequantise-and-dot reference at every
row count, give a row the same floats whatever rows share its forward (one row included), give the
same floats on every instruction set, and survive the largest values the formats and Q8_K can hold."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import native
from tests.test_native_kernels import (BLOCK_BYTES, TYPES, assert_close, isas, random_blocks, reference,
                                       shipped_tensors)
from tests.test_native_kernels_q32x16 import same_bits

pytestmark = pytest.mark.skipif(native.library_path() is None, reason="speclm's kernels were not built here")

ROW_COUNTS = list(range(1, 65)) + [65, 130]


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("k", [256, 1536])
def test_the_layout_keeps_every_byte(weight_type, k):
    raw = random_blocks(weight_type, 48, k, np.random.default_rng(k))
    x16 = native.repack_x16(weight_type, raw, k)
    assert x16.shape == raw.shape and not np.array_equal(x16, raw)
    np.testing.assert_array_equal(native.repack_x16(weight_type, x16, k, back=True), raw)


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
def test_every_row_count_matches_the_reference(weight_type, isa):
    rng = np.random.default_rng(5)
    raw = random_blocks(weight_type, 32, 512, rng)  # two groups of sixteen
    for ny in ROW_COUNTS:
        x = (rng.standard_normal((ny, 512)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :256] = 0  # an all-zero activation block (Q8_K's d = 0)
        assert_close(native.gemm(weight_type + "_x16", raw, 512, x, isa), reference(weight_type, raw, x),
                     f"{weight_type} {isa} {ny} rows")


@pytest.mark.parametrize("weight_type", TYPES)
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it_nor_on_the_instruction_set(weight_type):
    rng = np.random.default_rng(6)
    raw = random_blocks(weight_type, 48, 1536, rng)
    x = rng.standard_normal((70, 1536)).astype(np.float32)
    first = None
    for isa in isas():
        block = native.gemm(weight_type + "_x16", raw, 1536, x, isa)
        for j in (0, 1, 17, 63, 64, 69):
            same_bits(native.gemm(weight_type + "_x16", raw, 1536, x[j:j + 1], isa)[0], block[j],
                      f"{weight_type} {isa} row {j} alone and in a block of 70")
        if first is not None:
            same_bits(block, first, f"{weight_type} {isa} against {isas()[0]}")
        first = block


def extreme_blocks(weight_type: str, rows: int, k: int) -> np.ndarray:
    """Every value at the format's largest quant and every scale at its largest (Q6_K: half the rows at
    -128): the sums the kernels keep in int16 before a scale multiplies them at their largest."""
    raw = np.zeros((rows, k // 256, BLOCK_BYTES[weight_type]), np.uint8)
    one = np.array([0.001], np.float16).view(np.uint8)
    if weight_type == "q4_K":
        raw[:, :, 0:2] = raw[:, :, 2:4] = one
        raw[:, :, 4:16] = 0xFF  # scales and mins 63
        raw[:, :, 16:] = 0xFF  # every value 15
    else:
        raw[:, :, 0:192] = 0xFF  # every value 63
        raw[:, :, 192:208] = np.where(np.arange(rows)[:, None, None] % 2, 0x80, 0x7F)  # scales -128 or 127
        raw[:, :, 208:210] = one
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
def test_the_largest_values_do_not_overflow(weight_type, isa):
    raw = extreme_blocks(weight_type, 16, 512)
    x = np.where(np.arange(512) % 3 == 0, -1.0, 1.0)[None, :] * np.ones((4, 1))  # Q8_K: every value ±127
    x[1] = 1.0
    x[2] = -1.0
    x = x.astype(np.float32)
    assert_close(native.gemm(weight_type + "_x16", raw, 512, x, isa), reference(weight_type, raw, x),
                 f"{weight_type} {isa} extreme")


def test_rows_off_the_group_size_are_refused():
    raw = random_blocks("q4_K", 24, 256, np.random.default_rng(8))
    with pytest.raises(ValueError, match="does not take"):
        native.repack_x16("q4_K", raw, 256)


@pytest.mark.parametrize("model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_real_tensors_of_the_shipped_models_match_the_reference(model):
    rng = np.random.default_rng(9)
    tensors = shipped_tensors(model)
    assert {t for _, t, _, _ in tensors} == set(TYPES), f"{model} has both Q4_K and Q6_K matmul weights"
    for name, weight_type, raw, k in tensors:
        for ny in (1, 2, 4, 7, 16, 64):
            x = rng.standard_normal((ny, k)).astype(np.float32)
            want = reference(weight_type, raw, x)
            for isa in isas():
                assert_close(native.gemm(weight_type + "_x16", raw, k, x, isa), want, f"{model} {name} {isa} {ny} rows")
