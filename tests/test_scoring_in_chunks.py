"""Scoring a prompt (prompt logprobs: echo with logprobs, max_tokens 0) is bounded in
memory: its rows are scored PREFILL_CHUNK at a time, even alone on the engine, and each
chunk's logits are reduced to log-probabilities before the next, where one forward over a
4095-token prompt had llama.cpp keep an output buffer of 4095 vocabulary-sized rows for
good (speclm/speculative/steps.py: _prefill_chunks). The chunks change no figure."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.engine import Engine
from speclm.sampling import softmax
from speclm.speculative.steps import PREFILL_CHUNK

PROMPT = [(7 * i) % 11 for i in range(3 * PREFILL_CHUNK + 40)]


class CountingToy(ToyBackend):
    """The toy target, recording how many rows of logits each forward returns."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.rows: list[int] = []

    def score_batch(self, items, last_rows=None, skip_rows=None):
        out = super().score_batch(items, last_rows, skip_rows)
        self.rows.append(sum(len(r) for r in out))
        return out


def target() -> CountingToy:
    return CountingToy(11, seed=3, order=2, n_ctx=2048)


def test_a_scored_prompt_never_returns_more_than_a_chunk_of_rows_a_forward():
    llm = LLM(target=target())
    res = llm.generate(PROMPT, SamplingParams(max_new_tokens=0, prompt_logprobs=1), SpecConfig(method="ar"))
    assert len(res.prompt_logprobs) == len(PROMPT)
    assert max(llm.target.rows) <= PREFILL_CHUNK and sum(llm.target.rows) >= len(PROMPT) - 1


def test_alone_on_the_engine_too():
    llm = LLM(target=target())
    engine = Engine(llm, max_concurrency=2)
    try:
        res = engine.submit(PROMPT, SamplingParams(max_new_tokens=2, prompt_logprobs=0),
                            SpecConfig(method="ar")).result()
    finally:
        engine.shutdown()
    assert len(res.prompt_logprobs) == len(PROMPT) and max(llm.target.rows) <= PREFILL_CHUNK


def test_the_chunks_score_every_prompt_token_as_one_forward_would():
    llm = LLM(target=target())
    res = llm.generate(PROMPT, SamplingParams(max_new_tokens=0, prompt_logprobs=0), SpecConfig(method="ar"))
    assert res.prompt_logprobs[0].logprob is None
    for i in (1, PREFILL_CHUNK - 1, PREFILL_CHUNK, PREFILL_CHUNK + 1, len(PROMPT) - 1):
        logp = np.log(softmax(llm.target.logits_for(PROMPT[:i])))
        assert res.prompt_logprobs[i].logprob == pytest.approx(logp[PROMPT[i]], abs=1e-12)


def test_a_prompt_that_is_not_scored_still_prefills_in_one_forward():
    """The bound is the scoring's: a plain prompt alone still goes in one forward."""
    llm = LLM(target=target())
    llm.generate(PROMPT, SamplingParams(max_new_tokens=1), SpecConfig(method="ar"))
    assert llm.target.rows[0] == 1 and len(llm.target.rows) <= 2
