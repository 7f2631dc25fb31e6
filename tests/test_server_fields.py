"""The OpenAI fields under speculation, through the real `openai` client against a
live server: logit_bias and penalties, logprobs (chat and completions, streamed and
not), echo scoring with max_tokens 0, and Predicted Outputs with their usage counts.
The toy target makes every answer exact; SmolLM2 drives the real path."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.sampling import softmax
from speclm.server import ServerConfig, create_app

from .test_server import C, CHAT, client, live, toy_llm


@pytest.fixture(scope="module")
def toy():
    llm = toy_llm()
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=4, default_spec=SpecConfig("auto", 8)))
    with live(app) as (url, _):
        yield llm, url


PENALTIES = dict(presence_penalty=0.6, frequency_penalty=1.2, logit_bias={"4": 5.0, "7": -100})


def test_bias_and_penalties_equal_the_librarys_plain_decoding(toy):
    llm, url = toy
    r = client(url).completions.create(model="toy", prompt="abcab", max_tokens=24, temperature=0, **PENALTIES)
    params = SamplingParams(max_new_tokens=24, presence_penalty=0.6, frequency_penalty=1.2,
                            logit_bias={4: 5.0, 7: -100})
    ar = llm.generate(llm.encode("abcab"), params, SpecConfig(method="ar"))
    assert r.choices[0].text == ar.text and "h" not in ar.text  # token 7 is "h": banned
    plain = client(url).completions.create(model="toy", prompt="abcab", max_tokens=24, temperature=0)
    assert plain.choices[0].text != r.choices[0].text


def test_chat_logprobs_streamed_and_not_are_the_raw_models(toy):
    llm, url = toy
    kw = dict(model="toy", messages=[{"role": "user", "content": "abc"}], max_tokens=12, temperature=0,
              logprobs=True, top_logprobs=2, frequency_penalty=0.5)
    full = client(url).chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert "".join(c.token for c in content) == full.choices[0].message.content
    context = llm.target.tokenize_chat([{"role": "user", "content": "abc"}])
    for c in content:
        tok = llm.target.tokenize(c.token, add_special=False)[0]
        logp = np.log(softmax(llm.target.logits_for(context)))
        assert c.logprob == pytest.approx(logp[tok], abs=1e-9) and len(c.top_logprobs) == 2
        assert c.top_logprobs[0].logprob == pytest.approx(logp.max(), abs=1e-9)
        context.append(tok)
    streamed = []
    for chunk in client(url).chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]


def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt(toy):
    llm, url = toy
    r = client(url).completions.create(model="toy", prompt="abcabd", max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "abcabd" and "".join(lp.tokens) == "abcabd" and lp.token_logprobs[0] is None
    ids = llm.encode("abcabd")
    want = [float(np.log(softmax(llm.target.logits_for(ids[:i])))[ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-9)
    assert lp.text_offset == list(range(6)) and r.usage.completion_tokens == 0
    more = client(url).completions.create(model="toy", prompt="abcabd", max_tokens=5, echo=True, logprobs=0,
                                          temperature=0)
    assert more.choices[0].text.startswith("abcabd") and len(more.choices[0].logprobs.tokens) == 6 + 5


def test_a_prediction_reports_its_tokens_and_never_changes_the_answer(toy):
    _, url = toy
    kw = dict(model="toy", messages=[{"role": "user", "content": "abcabc"}], max_tokens=40, temperature=0)
    plain = client(url).chat.completions.create(**kw)
    text = plain.choices[0].message.content
    for prediction in (text, text[:10] + "zz" + text[14:], "qqqq"):
        r = client(url).chat.completions.create(prediction={"type": "content", "content": prediction}, **kw)
        assert r.choices[0].message.content == text
        details = r.usage.completion_tokens_details
        assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(prediction)
    exact = client(url).chat.completions.create(  # sd-suffix: auto's toy-measured costs may never draft
        prediction={"type": "content", "content": [{"type": "text", "text": text}]},
        extra_body={"speculative": {"method": "sd-suffix", "k": 8}}, **kw)
    assert exact.choices[0].message.content == text
    assert exact.usage.completion_tokens_details.accepted_prediction_tokens == len(text)
    assert exact.usage.speculative["accepted"] > 0
    r = client(url).completions.create(model="toy", prompt="abcabc", max_tokens=20, temperature=0,
                                       extra_body={"prediction": "abcabcabcabc"})
    assert r.usage.completion_tokens_details.accepted_prediction_tokens >= 0


@pytest.mark.parametrize("path,body,param", [
    (C, {"prompt": "ab", "logit_bias": {"3": 101}}, "logit_bias"),
    (C, {"prompt": "ab", "logit_bias": {"99": 1}}, "logit_bias"),
    (C, {"prompt": "ab", "logit_bias": {"x": 1}}, "logit_bias"),
    (C, {"prompt": "ab", "presence_penalty": 3}, "presence_penalty"),
    (C, {"prompt": "ab", "frequency_penalty": "1"}, "frequency_penalty"),
    (C, {"prompt": "ab", "repetition_penalty": 0}, "repetition_penalty"),
    (C, {"prompt": "ab", "logprobs": 21}, "logprobs"),
    (C, {"prompt": "ab", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
    (C, {"prompt": "ab", "echo": True, "logprobs": 1, "stream": True}, "echo"),
    (C, {"prompt": "ab", "prediction": 5}, "prediction"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}], "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}], "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}], "prediction": "text"}, "prediction"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}], "prediction": {"type": "file", "content": "a"}},
     "prediction"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}], "prediction": {"type": "content", "content": "a"},
            "speculative": {"method": "sd-draft"}}, "prediction"),
    (CHAT, {"messages": [{"role": "user", "content": "ab"}],
            "prediction": {"type": "content", "content": "ab" * 200}}, "prediction"),
])
def test_every_new_field_with_a_bad_value_is_a_400_naming_it(toy, path, body, param):
    _, url = toy
    r = httpx.post(url + path, json={"max_tokens": 3, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err


def test_smollm2_logprobs_and_echo_equal_plain_decoding(smollm):
    """On a real model, through the server: greedy logprobs under sd-ngram equal ar's
    (SmolLM2's block forward is batch-invariant), and echo scores equal a plain forward's."""
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    with live(app) as (url, _):
        def run(method):
            return client(url).completions.create(model="smollm2", prompt=prompt, max_tokens=24, temperature=0,
                                                  logprobs=2, extra_body={"speculative": {"method": method}})
        ar, sd = run("ar"), run("sd-ngram")
        scored = client(url).completions.create(model="smollm2", prompt=prompt, max_tokens=0, echo=True,
                                                logprobs=0)
    assert sd.choices[0].text == ar.choices[0].text
    assert sd.choices[0].logprobs.token_logprobs == pytest.approx(ar.choices[0].logprobs.token_logprobs, abs=1e-4)
    ids = smollm.encode(prompt)
    seq = smollm.target.new_sequence()
    try:
        logits = smollm.target.score(seq, ids)
    finally:
        smollm.target.free(seq)
    want = [float(np.log(softmax(logits[i - 1]))[ids[i]]) for i in range(1, len(ids))]
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(want, abs=1e-3)


def test_the_openai_client_types_parse_every_new_field(toy):
    """The client's own response models hold the new fields (no extra, no validation error)."""
    _, url = toy
    r = client(url).chat.completions.create(model="toy", messages=[{"role": "user", "content": "abc"}],
                                            max_tokens=4, logprobs=True, top_logprobs=1,
                                            prediction={"type": "content", "content": "abcd"})
    assert isinstance(r.choices[0].logprobs.content[0].bytes, list)
    assert r.usage.completion_tokens_details.rejected_prediction_tokens >= 0
    assert isinstance(r, openai.types.chat.ChatCompletion)
