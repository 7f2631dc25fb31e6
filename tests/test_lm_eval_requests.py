"""lm-evaluation-harness 0.4.13's `local-completions` requests, byte for byte as it sends them
(its `_create_payload` for log-likelihoods), on SmolLM2: token-id prompts (its default
`tokenized_requests=True`, one list per request or several at `batch_size` > 1) and the same
prompts as strings get the answer its `parse_logprobs` reads: one entry per prompt token
and the generated token's last, the continuation's entries at [ctxlen:-1], and those equal
the same prompt scored alone (docs/server.md#logprobs-echo-and-predictions).
scripts/clients_lmeval.py runs lm-eval itself against the 1.5B target (docs/results.md#c59)."""

from __future__ import annotations

import httpx
import pytest

from speclm.server import ServerConfig, create_app

from .test_server import C, live

PAIRS = [("Question: What is the capital of France?\nAnswer:", " Paris"),
         ("Question: What is the capital of France?\nAnswer:", " Berlin"),
         ("Question: What is 13 + 29?\nAnswer:", " 42")]


@pytest.fixture(scope="module")
def url(smollm):
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    with live(app) as (address, _):
        yield address


def lm_eval_body(prompt) -> dict:
    """LocalCompletionsAPI._create_payload(messages, generate=False), lm-eval 0.4.13."""
    return {"model": "smollm2", "prompt": prompt, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}


def post(url: str, body: dict) -> dict:
    r = httpx.post(url + C, json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def parse(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """lm-eval's parse_logprobs for one choice: the continuation's sum and whether greedy."""
    lp = choice["logprobs"]
    tokens, tops = lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]
    return sum(tokens), all(t == max(top.values()) for t, top in zip(tokens, tops))


def encoded(smollm, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split: the continuation is the whole text's tokens after the context's."""
    ctx, whole = smollm.encode(context), smollm.encode(context + continuation)
    return ctx, whole[len(ctx):]


def test_token_id_prompts_score_each_continuation(url, smollm):
    for context, continuation in PAIRS:
        ctx, cont = encoded(smollm, context, continuation)
        choice = post(url, lm_eval_body([ctx + cont]))["choices"][0]
        assert len(choice["logprobs"]["token_logprobs"]) == len(ctx) + len(cont) + 1  # the generated token last
        assert choice["logprobs"]["token_logprobs"][0] is None
        total, _ = parse(choice, len(ctx))
        alone = post(url, {**lm_eval_body([ctx + cont]), "max_tokens": 0})["choices"][0]["logprobs"]
        assert total == sum(alone["token_logprobs"][len(ctx):])


def test_a_batch_of_prompts_answers_each_as_alone_in_order(url, smollm):
    prompts = [sum(encoded(smollm, c, x), []) for c, x in PAIRS]
    batch = post(url, lm_eval_body(prompts))["choices"]
    assert [c["index"] for c in batch] == [0, 1, 2]
    for prompt, choice in zip(prompts, batch):
        assert choice["logprobs"] == post(url, lm_eval_body([prompt]))["choices"][0]["logprobs"]


def test_string_prompts_score_as_their_token_ids(url, smollm):
    """tokenized_requests=False: lm-eval sends the decoded text and still slices at ctxlen."""
    for context, continuation in PAIRS:
        ctx, cont = encoded(smollm, context, continuation)
        text = post(url, lm_eval_body([context + continuation]))["choices"][0]
        ids = post(url, lm_eval_body([ctx + cont]))["choices"][0]
        assert parse(text, len(ctx)) == parse(ids, len(ctx))
        assert text["logprobs"]["tokens"] == ids["logprobs"]["tokens"]
