"""Log-probabilities on a grammar's forced runs (docs/design.md#batch-numerics): speculation
drafts the tokens a grammar forces and verifies them in one block forward, and each
token's reported logprob (and alternatives) is read from that token's raw row, before the
mask and the request's processors. On a backend whose block forward equals its one-row
forwards (the toy), speculative logprobs are therefore exactly `ar`'s, forced runs
included; on llama.cpp's kernels they differ by the block forward's rounding only."""

from __future__ import annotations

import pytest

from speclm import LLM, Grammar, SamplingParams, SpecConfig

from .test_lossless_harness import toy_heads
from .test_structured import SCHEMA, prompt, toy


@pytest.fixture(scope="module")
def llm():
    target = toy()
    with LLM(target=target, draft=toy(seed=5, order=1), heads=toy_heads(target)) as llm:
        yield llm


@pytest.mark.parametrize("method,k", [("sd-draft", 4), ("sd-ngram", 3), ("auto", 8)])
@pytest.mark.parametrize("grammar", [Grammar.json_schema(SCHEMA), Grammar.regex(r"(ab|ba){1,3}-xyz-[01]{2}")],
                         ids=["schema", "regex"])
def test_forced_runs_report_ars_logprobs_exactly(llm, method, k, grammar):
    params = SamplingParams(max_new_tokens=40, temperature=0.0, logprobs=3, grammar=grammar)
    sd = llm.generate(prompt(llm), params, SpecConfig(method, k))
    ar = llm.generate(prompt(llm), params, SpecConfig("ar"))
    assert sd.forced_tokens > 0  # the grammar forced a run, and speculation drafted it
    assert sd.token_ids == ar.token_ids
    assert sd.logprobs == ar.logprobs
