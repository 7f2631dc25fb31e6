"""Medusa heads: drafted from the target's own hidden state, trained here, adapted online.

The statistical losslessness cases (random heads unlike the target, with and
without online updates, and auto over medusa) live in test_lossless_harness.py.
Here: greedy identity, the hidden state llama.cpp returns, training end to end
on SmolLM2, and the checks that refuse a wrong heads file.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.errors import InvalidRequestError, ModelError
from speclm.heads.file import load_heads, output_matrix, save_heads, target_sha256
from speclm.heads.model import MedusaHeads
from speclm.heads.train import TrainConfig, WorkDir, train
from speclm.speculative.identity import compare_to_ar

from .test_lossless_harness import toy_heads

PROMPT = [0, 1, 2, 0, 1]


def greedy(llm: LLM, spec: SpecConfig, n: int = 40) -> list[int]:
    return llm.generate(PROMPT, SamplingParams(max_new_tokens=n), spec).token_ids


@pytest.mark.parametrize("online", [False, True])
def test_greedy_medusa_equals_greedy_plain_decoding_on_the_toy(online: bool) -> None:
    target = ToyBackend(5, seed=11, order=2, sharpness=1.2)
    llm = LLM(target=target, heads=toy_heads(target))
    spec = SpecConfig(method="medusa", k=3).with_options(online=online, online_lr=0.05)
    runs = [llm.generate(PROMPT, SamplingParams(max_new_tokens=60), spec) for _ in range(3)]
    ar = greedy(llm, SpecConfig(method="ar"), 60)
    assert all(r.token_ids == ar for r in runs)
    assert sum(r.summary.proposed for r in runs) > 0  # the heads really drafted
    if online:
        learner = next(iter(llm._learners.values()))
        assert learner.updates > 0 and not np.array_equal(learner.heads.W, llm._heads[None].W)


def test_online_heads_are_per_scope_and_clearable() -> None:
    """Adaptation learnt for one scope (API key) never changes another scope's heads."""
    target = ToyBackend(5, seed=11, order=2, sharpness=1.2)
    base = toy_heads(target)
    llm = LLM(target=target, heads=base)
    a = SpecConfig(method="medusa", k=3, cache_scope="key-a").with_options(online=True, online_lr=0.05)
    b = SpecConfig(method="medusa", k=3, cache_scope="key-b").with_options(online=True)
    for seed in range(20):
        llm.generate(PROMPT, SamplingParams(max_new_tokens=30, temperature=1.0, seed=seed), a)
    heads_a, learner_a = llm.medusa_heads(a)
    heads_b, learner_b = llm.medusa_heads(b)
    assert learner_a.updates > 0 and learner_b.updates == 0
    assert np.array_equal(heads_b.W, base.W) and not np.array_equal(heads_a.W, base.W)
    llm.clear_heads("key-a")
    assert np.array_equal(llm.medusa_heads(a)[0].W, base.W)


def test_medusa_without_trained_heads_names_the_fix(tmp_path, monkeypatch, smol) -> None:
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("speclm.heads.file.PACKAGED", tmp_path / "none")
    llm = LLM(target=smol.target)
    with pytest.raises(InvalidRequestError, match="speclm heads train"):
        llm.generate("def f(x):", SamplingParams(max_new_tokens=4), SpecConfig(method="medusa"))


def test_the_hidden_state_is_what_the_output_head_multiplies(smol) -> None:
    """llama.cpp's per-row embedding (pooling NONE) times the GGUF output matrix gives the logits."""
    target = smol.target
    target.enable_hidden()
    seq = target.new_sequence()
    try:
        logits = target.score(seq, target.tokenize("def add(a, b):\n    return"))
        start, hidden = target.hidden_states(seq)
    finally:
        target.free(seq)
    assert start == 0 and hidden.shape == (logits.shape[0], target.hidden_size)
    top = np.argsort(-logits[-1])[:64]
    rebuilt = hidden[-1] @ output_matrix(target.path, top).T
    assert np.abs(rebuilt - logits[-1, top]).max() < 0.05 * np.abs(logits[-1, top]).max()
    assert np.argmax(rebuilt) == 0  # the same top token


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 with hidden states on: its own LLM, so other tests' backend stays as it was."""
    llm = LLM(target="smollm2-135m", max_sequences=2)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, smol):
    """Heads for SmolLM2 trained end to end (collection + training) under a minute."""
    root = tmp_path_factory.mktemp("heads")
    backend = smol.target
    sha = target_sha256(backend.path)
    t0 = time.monotonic()
    report = train(backend, backend.path, sha, root / "smol.npz", WorkDir(root / "work"),
                   TrainConfig(n_heads=3, vocab=2048, tokens=4000, minutes=0.8))
    return report, time.monotonic() - t0, root / "smol.npz"


def test_training_on_smollm2_beats_a_unigram_baseline_within_a_minute(trained) -> None:
    report, seconds, path = trained
    assert seconds < 60
    head1 = report["after"][0]
    assert head1["n"] >= 100 and head1["accuracy"] > head1["unigram"], report["after"]
    assert path.is_file() and report["trained_tokens"] >= 1000


def test_trained_heads_draft_and_greedy_output_matches_plain_decoding(trained, smol) -> None:
    """Greedy identity within the batch-numerics rule: identical, or a divergence at a near-tie."""
    _, _, path = trained
    llm = LLM(target=smol.target)
    prompt = llm.encode("import os\nimport sys\n\n\ndef main():\n")
    spec = SpecConfig(method="medusa", k=3).with_options(heads=str(path))
    out = llm.generate(prompt, SamplingParams(max_new_tokens=48), spec)
    ar = llm.generate(prompt, SamplingParams(max_new_tokens=48), SpecConfig(method="ar"))
    report = compare_to_ar(smol.target, prompt, ar.token_ids, out.token_ids)
    assert report.identical or report.ar_top2_margin < 0.5, report
    assert out.summary.proposed > 0 and all("heads_ms" in r.info for r in out.rounds if r.proposed)


def test_a_heads_file_for_another_target_or_shape_is_refused(trained, smol, tmp_path) -> None:
    _, _, path = trained
    target = smol.target
    good = load_heads(path, target.path, target.hidden_size, target.vocab_size)
    other = MedusaHeads(good.W, good.b, good.out, good.vocab_ids, good.vocab_size, target_sha256="0" * 64)
    save_heads(other, tmp_path / "other.npz")
    with pytest.raises(ModelError, match="trained for target sha256 000000000000"):
        load_heads(tmp_path / "other.npz", target.path, target.hidden_size, target.vocab_size)
    small = MedusaHeads.fresh(2, np.zeros((4, 8), np.float32), np.arange(4), target.vocab_size, good.target_sha256)
    save_heads(small, tmp_path / "small.npz")
    with pytest.raises(ModelError, match="hidden size 8"):
        load_heads(tmp_path / "small.npz", target.path, target.hidden_size, target.vocab_size)


def test_a_corrupt_or_unchecked_heads_file_is_refused(trained, smol, tmp_path) -> None:
    _, _, path = trained
    target = smol.target
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    (tmp_path / "bad.npz.sha256").write_text(path.with_name(path.name + ".sha256").read_text())
    with pytest.raises(ModelError, match="corrupt or was edited"):
        load_heads(tmp_path / "bad.npz", target.path, target.hidden_size, target.vocab_size)
    (tmp_path / "bare.npz").write_bytes(path.read_bytes())
    with pytest.raises(ModelError, match="cannot be checked"):
        load_heads(tmp_path / "bare.npz", target.path, target.hidden_size, target.vocab_size)
