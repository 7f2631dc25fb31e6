"""speclm's kernels for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) compute W . x
exactly as the formats define it: against a straightforward reference (dequantise the weights with
gguf's reference code, quantise the activations per 32 values exactly as the kernels do, multiply in
float64) over random blocks, odd shapes, every row count 1..64 and beyond, each instruction set this
CPU has, and real tensors of the draft model (Q5_0, Q8_0) and SmolLM2 (Q4_1). Inside llama.cpp the
draft model on `speclm+tiled` gives the plain kernels' logits within the probe's tolerance."""

from __future__ import annotations

import json
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
from tests.test_native_kernels import isas

TYPES = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q8_0": T.Q8_0, "iq4_nl": T.IQ4_NL}
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q8_0": 34, "iq4_nl": 18}

pytestmark = pytest.mark.skipif(native.library_path() is None, reason="speclm's kernels were not built here")


def quantise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activations as the kernels (and ggml's x86 quantize_row_q8_0 / q8_1) quantise them, per 32
    values in float32: amax, d = amax / 127, id = 127 / amax, q = clip(round_half_even(x * id), -127, 127);
    d is kept rounded to f16, and Q8_1's s = f16(d * Σq) (d before that rounding). Returns q (rows,
    blocks, 32), d and s (rows, blocks), in float64."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((blocks * inv[..., None]).astype(np.float32)), -127, 127)
    s = (d * q.sum(axis=2).astype(np.float32)).astype(np.float16)
    return q.astype(np.float64), d.astype(np.float16).astype(np.float64), s.astype(np.float64)


def q8_0(x: np.ndarray) -> np.ndarray:
    """The quantised activations, dequantised (q * d, exact in float64)."""
    q, d, _ = quantise(x)
    return (q * d[..., None]).reshape(x.shape)


def reference(weight_type: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W . x in float64 over the dequantised weights and activations; Q4_1's min multiplies Q8_1's s
    (d * Σq rounded to f16, as ggml's vec_dot does) rather than the exact d * Σq."""
    w = dequantize(raw, TYPES[weight_type]).reshape(raw.shape[0], -1).astype(np.float64)
    out = q8_0(x) @ w.T
    if weight_type == "q4_1":
        q, d, s = quantise(x)
        m = raw.reshape(raw.shape[0], -1, 20)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        out += (s - d * q.sum(axis=2)) @ m.T  # rows x blocks times blocks x weight rows
    return out


def random_blocks(weight_type: str, rows: int, k: int, rng) -> np.ndarray:
    """Random bytes for every field, with finite f16 scales (and Q4_1 mins) of a plausible size."""
    nb = k // 32
    raw = rng.integers(0, 256, size=(rows, nb, BLOCK_BYTES[weight_type]), dtype=np.uint8)
    f16 = lambda: (rng.standard_normal((rows, nb)) * 0.01).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    raw[:, :, 0:2] = f16()
    if weight_type == "q4_1":
        raw[:, :, 2:4] = f16()
    return raw.reshape(rows, nb * BLOCK_BYTES[weight_type])


TIES = np.array([127, 2.5, -3.5, 0.5, -0.5, 1.5, -1.5, 126.5] + [0.25] * 24, np.float32)


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    # The integer dot of each block is exact; what differs from the float64 reference is float32:
    # the product d_w * d_x and one fused multiply-add per block (two for Q4_1), each rounded to
    # 2^-24 of its size, summed over K/32 blocks. Measured here up to ~6e-7 of the largest output
    # for K = 4128 (129 blocks); 2e-6 (about 30 ulps) is the bound, as for the k-quant kernels.
    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-12))
    assert err < 2e-6, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
def test_every_row_count_matches_the_reference(weight_type, isa):
    rng = np.random.default_rng(1)
    raw = random_blocks(weight_type, 21, 256, rng)  # 21 weight rows: a full tile and a partial one
    for ny in list(range(1, 65)) + [65, 130]:
        x = rng.standard_normal((ny, 256)).astype(np.float32)
        assert_close(native.gemm(weight_type, raw, 256, x, isa), reference(weight_type, raw, x),
                     f"{weight_type} {isa} {ny} rows")


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("rows,k", [(1, 32), (2, 32), (7, 96), (16, 96), (37, 4096 + 32)])
def test_odd_shapes_match_the_reference(weight_type, isa, rows, k):
    rng = np.random.default_rng(rows * k)
    raw = random_blocks(weight_type, rows, k, rng)
    for ny in (1, 3, 16, 65):
        x = (rng.standard_normal((ny, k)) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :32] = 0  # an all-zero activation block (d = 0)
        x[-1, -32:] = TIES  # d = 1: x * id lands on halves, rounded to even
        assert_close(native.gemm(weight_type, raw, k, x, isa), reference(weight_type, raw, x),
                     f"{weight_type} {isa} {rows}x{k}, {ny} rows")


@pytest.mark.parametrize("isa", isas())
def test_extreme_blocks_do_not_overflow_the_int16_sums(isa):
    # the largest products vpmaddubsw and the int16 groups see: every weight value at its extreme,
    # every activation at +-127 (the sign trick's |w| = 128 for Q8_0's -128 included)
    rng = np.random.default_rng(5)
    x = np.where(rng.random((4, 64)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[1] = 1.0
    x[2] = -1.0
    for weight_type in TYPES:
        for fill in (0x00, 0xFF, 0x80, 0x88, 0x77):
            raw = np.full((9, 2 * BLOCK_BYTES[weight_type]), fill, dtype=np.uint8)
            raw.reshape(9, 2, -1)[:, :, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
            if weight_type == "q4_1":
                raw.reshape(9, 2, -1)[:, :, 2:4] = np.frombuffer(np.float16(-0.25).tobytes(), np.uint8)
            assert_close(native.gemm(weight_type, raw, 64, x, isa), reference(weight_type, raw, x),
                         f"{weight_type} {isa} bytes {fill:#x}")


def test_a_row_length_off_the_block_size_is_refused():
    raw = random_blocks("q8_0", 2, 64, np.random.default_rng(6))
    with pytest.raises(ValueError, match="refused q8_0"):
        native.gemm("q8_0", raw, 48, np.ones((2, 48), np.float32), isas()[0])


def model_tensors(model: str, types: set[str]) -> list[tuple[str, str, np.ndarray, int]]:
    """(name, type, the first 40 rows' raw bytes, K) of each matmul weight kind of `types` in a model."""
    from speclm.models.catalog import resolve_model
    reader = GGUFReader(resolve_model(model))
    found, kinds = [], set()
    for t in reader.tensors:
        name = t.tensor_type.name.lower()
        kind = (t.name.split(".")[-2], name)
        if name not in types or kind in kinds or t.name == "token_embd.weight":
            continue
        kinds.add(kind)
        raw = np.asarray(t.data).reshape(int(t.shape[1]), -1)[:40]
        found.append((t.name, name, raw, int(t.shape[0])))
    return found


@pytest.mark.parametrize("model,types", [("qwen2.5-coder-0.5b", {"q5_0", "q8_0"}), ("smollm2-135m", {"q4_1"})])
def test_real_tensors_of_the_small_models_match_the_reference(model, types):
    rng = np.random.default_rng(7)
    tensors = model_tensors(model, types)
    assert {t for _, t, _, _ in tensors} == types, f"{model} has {types} matmul weights"
    for name, weight_type, raw, k in tensors:
        for ny in (1, 2, 4, 7, 16, 64):
            x = rng.standard_normal((ny, k)).astype(np.float32)
            want = reference(weight_type, raw, x)
            for isa in isas():
                assert_close(native.gemm(weight_type, raw, k, x, isa), want, f"{model} {name} {isa} {ny} rows")


CHILD = """
import json, sys
import numpy as np
from speclm import native
from speclm.backends import kernels as K
from speclm.backends.llamacpp import LlamaCppBackend
from speclm.models.catalog import resolve_model
config, out, model = K.parse_config(sys.argv[1]), sys.argv[2], sys.argv[3]
K.apply(config, model)  # the process-wide switches (tiled) as the probe's children set them
backend = LlamaCppBackend(resolve_model(model), n_ctx=256, n_threads=2, n_seq_max=1, kernels=config)
text = "def merge(a, b):\\n    out = []\\n    while a and b:\\n        out.append(a.pop(0))\\n" * 8
tokens = backend.tokenize(text, add_special=False)
found, handled = {}, {}
seq = backend.new_sequence()
backend.prefill(seq, tokens[:24])
before = native.handled()
for b in (2, 4, 16):  # verify blocks
    found[f"block{b}"] = backend.score(seq, tokens[24:24 + b])
    backend.rollback(seq, 24)
handled["blocks"] = native.handled() - before
backend.free(seq)
seq = backend.new_sequence()  # a prompt past the row range, then one-row decodes
before = native.handled()
found["prefill"] = backend.prefill(seq, tokens[:80])
found["decode1"], found["decode2"] = backend.score(seq, tokens[80:81]), backend.score(seq, tokens[81:82])
handled["declined"] = native.handled() - before
np.savez(out + "/logits.npz", **found)
print(json.dumps({"handled": handled, "rows": native.rows_range(), "status": native.status().reason}))
"""


def draft_child(config: str, out: Path, isa: str | None = None,
                model: str = "qwen2.5-coder-0.5b") -> tuple[dict[str, np.ndarray], dict]:
    """The draft model (or `model`) loaded with `config` in a child process (its switches fixed there, as the probe
    does; isa: the kernels it runs, else the CPU's best): the logits of verify blocks of 2, 4 and 16
    rows, of an 80-token prefill and two one-row decodes, and how many matmuls speclm's kernels
    computed for each part."""
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (K.TILED_ENV, native.ISA_ENV)}
    if isa:
        env[native.ISA_ENV] = isa
    proc = subprocess.run([sys.executable, "-c", CHILD, config, str(out), model], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(np.load(out / "logits.npz")), json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def draft_runs(tmp_path_factory):
    if K.build_info().unavailable("speclm"):
        pytest.skip(K.build_info().unavailable("speclm"))
    root = tmp_path_factory.mktemp("draft")
    runs = {c: draft_child(c, root / c) for c in ("plain", "plain+tiled")}
    runs.update({f"speclm+tiled {isa}": draft_child("speclm+tiled", root / isa, isa) for isa in isas()})
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("isa", isas())
def test_inside_llama_cpp_the_draft_models_logits_agree_with_the_plain_kernels(draft_runs, isa):
    from speclm.backends.probe import compare_logits
    got, info = draft_runs[f"speclm+tiled {isa}"]
    want, _ = draft_runs["plain"]
    assert info["status"].startswith(isa), info
    lo, hi = info["rows"]
    blocks = [b for b in (2, 4, 16) if lo <= b <= hi]
    # per layer q, k, v, o, gate, up (Q5_0 or Q8_0) at least, and the Q8_0 output head, in every block
    assert info["handled"]["blocks"] >= (24 * 6 + 1) * len(blocks), info
    names = [f"block{b}" for b in (2, 4, 16)]
    assert compare_logits({n: want[n] for n in names}, {n: got[n] for n in names}) is None
    for b in blocks[1:]:  # a row's logits do not depend on the block verifying it, as for the k-quants
        np.testing.assert_array_equal(got[f"block{b}"][:blocks[0]], got[f"block{blocks[0]}"][:b])


@pytest.mark.slow
@pytest.mark.parametrize("isa", isas())
def test_what_they_decline_runs_llama_cpps_own_kernels_bit_for_bit(draft_runs, isa):
    # an 80-row prefill (past the row range: llama.cpp's tiled path, whose workspace the buffer type's
    # work size must still cover) and one-row decodes (vec_dot) run ggml's code on the same bytes
    got, info = draft_runs[f"speclm+tiled {isa}"]
    want, _ = draft_runs["plain+tiled"]
    lo, hi = info["rows"]
    if lo < 2 or hi >= 80:
        pytest.skip(f"not the default setting: {info['status']}")
    assert info["handled"]["declined"] == 0, info
    for name in ("prefill", "decode1", "decode2"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.slow
def test_on_smollm2_the_kernels_give_the_plain_kernels_floats(tmp_path):
    # Q4_1 and Q8_0 are summed in ggml's vec_dot order (Q4_1: the plain kernels' only path; Q8_0: vec_dot
    # and tinyBLAS sum alike): SmolLM2 amplifies any rounding difference past the probe's tolerance (a
    # reordering moved its logits by 1.6), and its one-row forwards run ggml's code, so its logits
    # (Q4_1 layers, tied Q8_0 head) must be ggml's bit for bit in every block.
    if K.build_info().unavailable("speclm"):
        pytest.skip(K.build_info().unavailable("speclm"))
    want, _ = draft_child("plain+tiled", tmp_path / "plain", model="smollm2-135m")
    for isa in isas():
        got, info = draft_child("speclm+tiled", tmp_path / isa, isa, model="smollm2-135m")
        lo, hi = info["rows"]
        assert info["handled"]["blocks"] >= 30 * 7 * len([b for b in (2, 4, 16) if lo <= b <= hi]), info
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{isa} {name}")
