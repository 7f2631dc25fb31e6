"""Bad input through the Python API: a specific exception, a message that
names the problem and the fix, and an engine left usable afterwards.

Real models: SmolLM2-135M (loaded once per module, one thread so a busy
machine does not slow llama.cpp's thread barrier to a crawl) and, for the
tokenizer-mismatch check only, the Qwen2.5-Coder-1.5B target (loaded, never run).
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.api import MAX_K, METHODS, check_tokenizers, load_backend
from speclm.backends.toy import ToyBackend
from speclm.errors import (
    BackendError,
    InvalidRequestError,
    ModelError,
    SpeclmError,
    TokenizerMismatchError,
)
from speclm.models import catalog, store
from speclm.models.registry import REGISTRY, ModelSpec

SMOL = "smollm2-135m"
QWEN_TARGET = "qwen2.5-coder-1.5b"
TINY = SamplingParams(max_new_tokens=2)
AR = SpecConfig(method="ar")


@pytest.fixture(scope="module")
def llm():
    """SmolLM2-135M, no draft, default context."""
    with LLM(target=SMOL, n_threads=1) as model:
        yield model


@pytest.fixture(scope="module")
def small_llm():
    """SmolLM2-135M with a 64-token context."""
    with LLM(target=SMOL, n_ctx=64, n_threads=1) as model:
        yield model


@pytest.fixture(scope="module")
def smol_path() -> Path:
    return catalog.resolve_model(SMOL)


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, f"error message must be one non-empty line: {msg!r}"
    return msg


# ---- prompts ----------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t  \n"])
@pytest.mark.parametrize("chat", [False, True])
def test_empty_text_prompt(llm, prompt, chat):
    with pytest.raises(InvalidRequestError, match=r"prompt is empty: give some text") as err:
        llm.generate(prompt, TINY, AR, chat=chat)
    one_line(err.value)
    assert isinstance(err.value, ValueError)  # InvalidRequestError is also a ValueError
    assert llm.target.live_sequences == 0


def test_empty_token_list(llm):
    with pytest.raises(InvalidRequestError, match=r"prompt is empty: give at least one token"):
        llm.generate([], TINY, AR)
    assert llm.target.live_sequences == 0


def test_empty_prompt_rejected_before_any_work_with_every_method(llm):
    for spec in (AR, SpecConfig(method="sd-ngram")):
        with pytest.raises(InvalidRequestError, match="prompt is empty"):
            llm.generate("", TINY, spec)
    assert llm.target.live_sequences == 0


def test_prompt_longer_than_context(small_llm):
    text = "hello world " * 40
    n = len(small_llm.encode(text))
    assert n > 64
    for spec in (AR, SpecConfig(method="sd-ngram")):
        with pytest.raises(InvalidRequestError) as err:
            small_llm.generate(text, TINY, spec)
        msg = one_line(err.value)
        assert f"{n} tokens" in msg and "holds 64" in msg
        assert "n_ctx" in msg and "--n-ctx" in msg and "shorten the prompt" in msg
    assert small_llm.target.live_sequences == 0


def test_prompt_of_exactly_n_ctx_tokens_rejected_and_one_less_served(small_llm):
    ids = small_llm.encode("hello world " * 40)
    with pytest.raises(InvalidRequestError, match=r"64 tokens but the context holds 64.*--n-ctx"):
        small_llm.generate(ids[:64], TINY, AR)
    # n_ctx - 1 tokens fit: exactly one token of room, then a "length" finish
    out = small_llm.generate(ids[:63], SamplingParams(max_new_tokens=4), SpecConfig(method="sd-ngram"))
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    assert small_llm.target.live_sequences == 0


@pytest.mark.parametrize("n_ctx", [0, 8, 15, -1, "64", 64.0])
def test_bad_n_ctx(n_ctx):
    with pytest.raises(InvalidRequestError, match=r"n_ctx must be an integer >= 16") as err:
        LLM(target=SMOL, n_ctx=n_ctx, n_threads=1)
    assert repr(n_ctx) in str(err.value)


@pytest.fixture
def no_llama_context(monkeypatch):
    """Fail fast instead of letting llama.cpp spawn an absurd number of threads
    (100000 segfaults or hangs the process on this machine)."""
    from speclm.backends import llamacpp

    def refuse(model, cparams):
        raise AssertionError(f"a llama.cpp context was created with n_threads={cparams.n_threads}")
    monkeypatch.setattr(llamacpp.L, "llama_init_from_model", refuse)


@pytest.mark.parametrize("n_threads", [-1, 100_000, 2.5])
def test_bad_n_threads(no_llama_context, n_threads):
    with pytest.raises(InvalidRequestError, match=r"n_threads|--threads"):
        LLM(target=SMOL, n_threads=n_threads)


@pytest.mark.parametrize("bad_ids", [[1, 10**6], [-1], [1, "a"]], ids=["too-large", "negative", "not-int"])
def test_token_ids_outside_vocab(llm, bad_ids):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate(bad_ids, TINY, AR)
    msg = one_line(err.value)
    assert "token" in msg and str(llm.target.vocab_size) in msg


def test_failed_request_leaves_the_engine_usable(llm):
    """Whatever a bad token id raises, the sequence is freed and the next request works."""
    with pytest.raises((SpeclmError, TypeError)):
        llm.generate([1, 10**6], TINY, AR)
    assert llm.target.live_sequences == 0
    out = llm.generate("def add(a, b):", TINY, AR)
    assert len(out.token_ids) == 2 and llm.target.live_sequences == 0


@pytest.mark.parametrize("prompt", [(1, 2, 3), np.array([1, 2, 3])], ids=["tuple", "ndarray"])
def test_prompt_of_wrong_type_is_not_called_empty(llm, prompt):
    try:
        llm.generate(prompt, TINY, AR)  # accepting a sequence of ids is a fine fix too
    except InvalidRequestError as exc:
        msg = str(exc)
        assert "empty" not in msg and type(prompt).__name__ in msg


# ---- SpecConfig -------------------------------------------------------------
@pytest.mark.parametrize("method", ["sd-draft", "sd-ngram"])
@pytest.mark.parametrize("k", [0, -1, 1000, MAX_K + 1, 4.0, "4", True])
def test_bad_k(method, k):
    with pytest.raises(InvalidRequestError) as err:
        SpecConfig(method=method, k=k)
    msg = one_line(err.value)
    assert msg.startswith("K must be an integer in [1, 32]")
    assert method in msg and repr(k) in msg


@pytest.mark.parametrize("method", ["sd-draft", "sd-ngram"])
@pytest.mark.parametrize("k", [1, MAX_K])
def test_k_bounds_accepted(method, k):
    assert SpecConfig(method=method, k=k).effective_k == k


@pytest.mark.parametrize(("method", "k"), [("sd-draft", 4), ("sd-ngram", 4), ("auto", 16), ("sd-suffix", 16)])
def test_k_unset_is_the_methods_default(method, k):
    assert SpecConfig(method=method).k == SpecConfig(method=method, k=None).k == k


@pytest.mark.parametrize("method", ["", "AR", "sd", "eagle", None])
def test_unknown_method(method):
    with pytest.raises(InvalidRequestError) as err:
        SpecConfig(method=method)
    msg = one_line(err.value)
    assert f"unknown method {method!r}" in msg
    assert all(m in msg for m in METHODS)


@pytest.mark.parametrize("k", [0, -1, 1000, None])
def test_ar_ignores_k(llm, k):
    spec = SpecConfig(method="ar", k=k)
    assert spec.effective_k == 0
    out = llm.generate("def add(a, b):", TINY, spec)
    assert len(out.token_ids) == 2 and out.k == 0 and out.draft is None


@pytest.mark.parametrize("lo,hi", [(0, 2), (3, 2), (-1, 4), (2, 65)])
def test_bad_ngram_sizes(llm, lo, hi):
    with pytest.raises(InvalidRequestError, match=r"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 64") as err:
        llm.generate("def add(a, b):", TINY, SpecConfig(method="sd-ngram", ngram_min=lo, ngram_max=hi))
    assert f"got {lo}..{hi}" in str(err.value)
    assert llm.target.live_sequences == 0


# ---- SamplingParams ---------------------------------------------------------
BAD_SAMPLING = [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", -math.inf), ("temperature", "0.7"),
    ("top_p", 0), ("top_p", 0.0), ("top_p", 1.5), ("top_p", -1), ("top_p", math.nan),
    ("top_k", -1), ("top_k", 2.5),
    ("min_p", 1.0), ("min_p", -0.1), ("min_p", math.nan),
    ("max_new_tokens", 0), ("max_new_tokens", -3), ("max_new_tokens", 16.0),
    ("seed", -1), ("seed", 1.5),
    ("stop", ""), ("stop", ("ok", "")), ("stop", ["\n", 3]),
]


@pytest.mark.parametrize("field,value", BAD_SAMPLING, ids=[f"{f}={v!r}" for f, v in BAD_SAMPLING])
def test_bad_sampling_param_names_the_field(field, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    msg = one_line(err.value)
    name = "stop strings" if field == "stop" else field
    assert msg.startswith(f"{name} must be"), msg  # names the field and its valid range
    assert "got" in msg


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0), dict(temperature=2.5), dict(top_p=1.0), dict(top_p=1e-6), dict(top_k=0),
    dict(min_p=0.0), dict(min_p=0.999), dict(seed=0), dict(max_new_tokens=1), dict(stop="x"),
    dict(stop=["a", "b"]),
])
def test_sampling_edge_values_accepted(kwargs):
    p = SamplingParams(**kwargs)
    assert isinstance(p.stop, tuple)


def test_stop_none():
    try:
        assert SamplingParams(stop=None).stop == ()
    except InvalidRequestError as exc:
        assert "stop" in str(exc)


# ---- model names and paths --------------------------------------------------
def test_unknown_model_name_lists_known_names():
    with pytest.raises(ModelError) as err:
        LLM(target="no-such-model")
    msg = one_line(err.value)
    assert "unknown model 'no-such-model'" in msg
    assert all(name in msg for name in REGISTRY) and ".gguf path" in msg


def test_unknown_draft_name(llm):
    model = LLM(target=llm.target, draft="no-such-draft")  # a Backend is used as is
    with pytest.raises(ModelError, match=r"unknown model 'no-such-draft'; known models: "):
        model.generate("def f():", TINY, SpecConfig(method="sd-draft"))
    assert llm.target.live_sequences == 0


def test_nonexistent_gguf_path(tmp_path):
    path = tmp_path / "missing.gguf"
    with pytest.raises(ModelError) as err:
        LLM(target=str(path))
    msg = one_line(err.value)
    assert f"model file {path} does not exist" in msg and "existing .gguf path" in msg
    assert all(name in msg for name in REGISTRY)


@pytest.mark.parametrize("content", [b"this is not a model at all\n" * 50, b"", b"GGU"],
                         ids=["junk", "empty", "short-magic"])
def test_file_that_is_not_gguf(tmp_path, content):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelError) as err:
        LLM(target=str(path))
    msg = one_line(err.value)
    assert f"{path} is not a GGUF file" in msg and "expected b'GGUF'" in msg


def test_directory_named_like_a_model(tmp_path):
    path = tmp_path / "dir.gguf"
    path.mkdir()
    with pytest.raises(ModelError, match=r"cannot read model file .*pass a readable .gguf file"):
        load_backend(str(path))


# ---- integrity of a registered model ----------------------------------------
@pytest.fixture
def registered_copy(tmp_path, monkeypatch, smol_path):
    """Register copies of the SmolLM2 GGUF as temporary models in an empty cache:
    "copy-smol" is assembled from one chunk (like the Qwen pair), "inplace-smol"
    is used in place (like smollm2-135m). Returns the chunk / in-place file paths."""
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(tmp_path / "cache"))
    real = REGISTRY[SMOL]
    src = tmp_path / "dist" / "model.gguf"
    src.parent.mkdir()
    shutil.copyfile(smol_path, src)
    chunked = ModelSpec("copy-smol", "test copy", "tiny", ("copy-smol-dist",), "1.0", real.size, real.sha256)
    inplace = ModelSpec("inplace-smol", "test copy", "tiny", ("inplace-smol-dist",), "1.0", real.size,
                        real.sha256, single_file="inplace_smol/model.gguf")
    monkeypatch.setitem(REGISTRY, chunked.name, chunked)
    monkeypatch.setitem(REGISTRY, inplace.name, inplace)
    orig = store.chunk_paths
    monkeypatch.setattr(store, "chunk_paths",
                        lambda spec: [src] if spec.name in (chunked.name, inplace.name) else orig(spec))
    return src


def flip_middle_byte(path: Path) -> None:
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(st.st_size // 2)  # deep inside the tensor data
        byte = fh.read(1)
        fh.seek(st.st_size // 2)
        fh.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


def test_registered_copy_loads_when_intact(registered_copy, tmp_path):
    with LLM(target="copy-smol", n_threads=1) as model:
        assert model.target.path == tmp_path / "cache" / "copy-smol.gguf"
        assert model.target.vocab_size == 49152


@pytest.mark.parametrize("name,fix", [
    ("copy-smol", "`speclm models verify copy-smol --repair`"),
    ("inplace-smol", "`pip install --force-reinstall inplace-smol-dist==1.0`"),
])
def test_tampered_registered_model(registered_copy, name, fix):
    path = catalog.resolve_model(name)  # assembled / stamped while intact
    flip_middle_byte(path)
    with pytest.raises(store.CorruptModelError) as err:
        LLM(target=name, n_threads=1)
    msg = one_line(err.value)
    assert isinstance(err.value, ModelError)
    assert f"model file {path} is corrupt (sha256 mismatch" in msg and "corrupt" in msg
    assert REGISTRY[name].sha256[:12] in msg
    assert f"repair it with {fix}" in msg
    # also as a draft: checked when the draft is first used
    with LLM(target=SMOL, draft=name, n_threads=1) as model:
        with pytest.raises(store.CorruptModelError, match="sha256 mismatch"):
            model.draft


@pytest.mark.parametrize("name", ["copy-smol", "inplace-smol"])
def test_truncated_registered_model(registered_copy, name):
    path = catalog.resolve_model(name)
    size = path.stat().st_size
    truncate(path, size // 2)
    with pytest.raises(ModelError) as err:
        LLM(target=name, n_threads=1)
    msg = one_line(err.value)
    assert f"is corrupt (truncated: {size // 2} bytes, expected {size})" in msg
    assert "repair it with `" in msg


def test_repair_command_in_the_message_fixes_the_model(registered_copy, capsys):
    from speclm.commands import main

    path = catalog.resolve_model("copy-smol")
    flip_middle_byte(path)
    with pytest.raises(ModelError) as err:
        catalog.resolve_model("copy-smol")
    command = re.search(r"`speclm (models verify copy-smol --repair)`", str(err.value)).group(1)
    assert main(command.split()) == 0
    assert "REPAIRED copy-smol" in capsys.readouterr().out
    assert store.sha256_file(path) == REGISTRY["copy-smol"].sha256
    with LLM(target="copy-smol", n_threads=1) as model:
        assert model.target.vocab_size == 49152


# ---- a local GGUF path is not hashed, but llama.cpp must reject a broken one --
@pytest.fixture
def truncated_local(tmp_path, smol_path) -> Path:
    path = tmp_path / "half.gguf"
    with open(smol_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(smol_path.stat().st_size // 2))
    return path


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0001], ids=["half", "almost-all", "header-only"])
def test_truncated_local_gguf_is_a_model_error(tmp_path, smol_path, keep):
    path = tmp_path / "cut.gguf"
    with open(smol_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(int(smol_path.stat().st_size * keep)))
    with pytest.raises(ModelError) as err:
        LLM(target=str(path), n_threads=1)
    msg = one_line(err.value)
    assert f"llama.cpp could not load {path}" in msg and "corrupt, incomplete" in msg


def test_tampered_local_gguf_is_not_hashed_by_design(tmp_path, smol_path):
    path = tmp_path / "flipped.gguf"
    shutil.copyfile(smol_path, path)
    flip_middle_byte(path)
    assert catalog.resolve_model(str(path)) == path  # no sha256 for a user's own file
    assert store.sha256_file(path) != REGISTRY[SMOL].sha256


def test_truncated_local_gguf_message_names_cause_and_a_working_fix(truncated_local, capsys):
    from speclm.commands import main

    with pytest.raises(ModelError) as err:
        LLM(target=str(truncated_local), n_threads=1)
    msg = str(err.value).replace(str(truncated_local), "<path>")  # the tmp path itself says "truncated"
    assert re.search(r"truncated|incomplete|file bounds", msg), msg
    if "speclm models verify" in msg:
        main(["models", "verify", str(truncated_local)])
        assert "unknown model" not in capsys.readouterr().err


# ---- tokenizers ---------------------------------------------------------------
def test_tokenizer_mismatch_real_models():
    """Qwen2.5-Coder target with a SmolLM2 draft: caught when the draft is first used."""
    with LLM(target=QWEN_TARGET, draft=SMOL, n_ctx=256, n_threads=1) as model:
        assert model._draft is None  # lazily loaded: construction succeeds
        with pytest.raises(TokenizerMismatchError) as err:
            model.draft
        msg = one_line(err.value)
        assert "49152 tokens" in msg and "151936" in msg
        assert "different tokenizers; pick a draft from the target's family" in msg
        with pytest.raises(TokenizerMismatchError):
            model.generate("def f():", TINY, SpecConfig(method="sd-draft"))
        assert model.target.live_sequences == 0
        # the target itself is unaffected: other methods still work
        assert len(model.generate("def f():", TINY, SpecConfig(method="sd-ngram")).token_ids) == 2


def test_tokenizer_mismatch_toy_alphabets():
    target = ToyBackend(vocab_size=6, alphabet="abcdefgh", name="toy-abc")
    draft = ToyBackend(vocab_size=6, alphabet="zyxwvuts", name="toy-zyx")
    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizers(target, draft)
    msg = one_line(err.value)
    assert "toy-zyx" in msg and "toy-abc" in msg and "token id 0" in msg
    assert "(b'z' vs b'a')" in msg and "pick a draft from the target's family" in msg
    with pytest.raises(TokenizerMismatchError):
        LLM(target=target, draft=draft).generate("abc", TINY, SpecConfig(method="sd-draft"))
    assert target.live_sequences == 0


def test_tokenizer_mismatch_toy_late_id_and_vocab_size():
    base = ToyBackend(vocab_size=8, alphabet="abcdefgh")
    with pytest.raises(TokenizerMismatchError, match=r"token id 7 \(b'z' vs b'h'\)"):
        check_tokenizers(base, ToyBackend(vocab_size=8, alphabet="abcdefgz"))
    with pytest.raises(TokenizerMismatchError, match=r"has 20 tokens.*has 8: they are different tokenizers"):
        check_tokenizers(base, ToyBackend(vocab_size=20))


def test_same_toy_tokenizer_passes():
    target, draft = ToyBackend(vocab_size=6, seed=1), ToyBackend(vocab_size=6, seed=2)
    check_tokenizers(target, draft)  # different models, same tokenizer: fine
    out = LLM(target=target, draft=draft).generate("abc", SamplingParams(max_new_tokens=5),
                                                   SpecConfig(method="sd-draft", k=2))
    assert len(out.token_ids) == 5


# ---- sd-draft without a draft ---------------------------------------------------
def test_sd_draft_without_a_draft(llm):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("def f():", TINY, SpecConfig(method="sd-draft"))
    msg = one_line(err.value)
    assert "sd-draft needs a draft model" in msg and "draft=NAME|PATH" in msg and "--draft" in msg
    with pytest.raises(InvalidRequestError, match="needs a draft model"):
        llm.draft
    assert llm.target.live_sequences == 0


def test_default_spec_without_a_draft_needs_no_draft(llm):
    out = llm.generate("def f():", TINY)  # no spec, no draft: auto over prompt lookup, not an error
    assert out.method == "auto" and out.draft.startswith("suffix") and len(out.token_ids) == 2


def test_no_draft_needed_for_other_methods(llm):
    for spec in (AR, SpecConfig(method="sd-ngram", k=3)):
        assert len(llm.generate("def f():", TINY, spec).token_ids) == 2


@pytest.mark.parametrize("cls", [ModelError, TokenizerMismatchError, InvalidRequestError, BackendError])
def test_every_user_fixable_error_reaches_the_command_line_as_one_line(cls, capsys, monkeypatch):
    """Whatever kind of speclm error a command raises, `speclm` prints it as one
    `speclm: error:` line and exits 1, never with a traceback."""
    from speclm.commands import generate, main
    def fail(args):
        raise cls("the problem, and the fix")
    monkeypatch.setattr(generate, "cmd_generate", fail)
    assert main(["generate", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "speclm: error: the problem, and the fix\n"
