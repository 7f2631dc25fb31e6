"""The cost model prices a shared forward as the passes the backend makes over it.

llama.cpp with one KV stream per sequence splits a forward into passes: each takes
the lowest sequence still holding tokens and the run of consecutive ids after it,
and the same number of tokens from each (at most n_ubatch rows).
`LlamaCppBackend.pass_rows` must predict exactly the passes llama.cpp reports
(LLAMA_BATCH_DEBUG). The backend submits a forward in stream order and keeps
the live streams one run of ids (a new sequence takes the lowest free stream;
freeing one moves the highest into the gap), so requests sharing steps share passes.
A backend without such a split prices the forward as one pass.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from speclm import LLM
from speclm.backends.toy import ToyBackend
from speclm.costs import CostModel

# (sequence ids in submission order, block lengths)
SHAPES = [([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [1, 3, 5]), ([2, 0, 1], [2, 2, 7]), ([0, 2], [1, 1]),
          ([1, 0], [1, 17]), ([0, 1], [300, 300]), ([0, 1, 2], [1, 300, 200]), ([3, 1, 0], [5, 1, 1])]


def passes_reported(log: str) -> list[int]:
    """Rows of each pass llama.cpp's batch splitter logged ("added ubatch", then n_tokens)."""
    return [int(n) for n in re.findall(r"added ubatch[^\n]*\n(?:[^\n]*\n)*?[^\n]*n_tokens\s*=\s*(\d+)", log)]


def test_llama_cpp_passes_are_predicted_exactly(monkeypatch, capfd):
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")  # read when the context is created
    llm = LLM(target="smollm2-135m", n_threads=2, max_sequences=4, n_ctx=1024)
    target = llm.target
    monkeypatch.setenv("SPECLM_LLAMA_LOG", "1")
    try:
        seqs = [target.new_sequence() for _ in range(4)]
        assert seqs == [0, 1, 2, 3]  # a fresh backend: handles and KV streams coincide
        for seq in seqs:
            target.prefill(seq, [1, 2, 3])
        for ids, shape in SHAPES:
            capfd.readouterr()
            target.score_batch([(seq, [5 + i % 50 for i in range(n)]) for seq, n in zip(ids, shape)])
            reported = passes_reported(capfd.readouterr().err)
            for seq in ids:
                target.rollback(seq, 3)
            expected = target.pass_rows(dict(zip(ids, shape)))
            assert reported == expected, f"blocks {dict(zip(ids, shape))}: llama.cpp made passes {reported}, predicted {expected}"
    finally:
        llm.close()


def test_freeing_a_sequence_keeps_the_live_ones_one_pass_and_their_state(monkeypatch, capfd):
    """Freeing a middle sequence moves the highest one into its KV stream: a forward
    over the survivors is still one pass, and the moved sequence scores exactly as
    before (its cache was copied, not recomputed). The predicted passes, which the
    backend remembers, follow the move."""
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    llm = LLM(target="smollm2-135m", n_threads=2, max_sequences=4, n_ctx=256)
    target = llm.target
    try:
        prompts = [llm.encode(p) for p in ("def add(a, b):", "The capital of France is", "for i in range(3):")]
        a, b, c = (target.new_sequence() for _ in prompts)
        for seq, ids in zip((a, b, c), prompts):
            target.prefill(seq, ids)
        before = target.score(c, [11])
        target.rollback(c, len(prompts[2]))
        assert target.pass_rows({a: 1, c: 3}) == [1, 3]  # streams 0 and 2: not one run
        target.free(b)
        assert target.pass_rows({a: 1, c: 3}) == [2, 2]  # c moved into stream 1
        monkeypatch.setenv("SPECLM_LLAMA_LOG", "1")
        capfd.readouterr()
        rows = target.score_batch([(a, [11]), (c, [11])])
        assert passes_reported(capfd.readouterr().err) == [2]
        assert np.allclose(rows[1][0], before[0], atol=1e-3)
        d = target.new_sequence()  # takes the stream c left
        target.prefill(d, prompts[1])
        capfd.readouterr()
        target.score_batch([(c, [12]), (a, [12]), (d, [12])])
        assert passes_reported(capfd.readouterr().err) == [3]
    finally:
        llm.close()


def test_a_backend_without_a_split_runs_one_pass():
    toy = ToyBackend(6, seed=1, n_ctx=64)
    assert toy.pass_rows({0: 1, 1: 3, 5: 5}) == [9]
    assert toy.pass_rows({}) == []


@pytest.mark.parametrize("passes, expected", [(None, 100.0), ([2, 3], 30.0 + 45.0)])
def test_a_step_costs_the_sum_of_its_passes(passes, expected):
    cost = CostModel(verify_ms={1: 10.0, 2: 30.0, 3: 45.0, 5: 100.0},
                     passes=None if passes is None else (lambda blocks: passes))
    assert cost.step({0: 2, 1: 3}) == pytest.approx(expected)
