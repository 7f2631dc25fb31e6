"""A property-based fuzz of the request schemas against a live toy server: bodies
built from the fields both endpoints declare, each with well-typed, out-of-range and
wrongly typed values. Every answer is a 200 or a 4xx in OpenAI's error shape; never a
5xx, never a traceback. Bounded: a fixed number of examples, no shrinking deadline."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclm.server import ServerConfig, create_app
from speclm.speculative.config import SpecConfig

from .test_server import C, CHAT, live, toy_llm

ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                st.text(max_size=8), st.lists(st.integers(-3, 40), max_size=4),
                st.dictionaries(st.text(max_size=3), st.integers(-200, 200), max_size=3))
TEXT = st.text(alphabet="abcdefgh \n", min_size=0, max_size=12)
FIELDS = {
    "max_tokens": st.one_of(st.integers(-2, 6), ANY),
    "temperature": st.one_of(st.floats(-1, 3), ANY),
    "top_p": st.one_of(st.floats(0, 1.2), ANY),
    "presence_penalty": st.one_of(st.floats(-3, 3), ANY),
    "frequency_penalty": st.one_of(st.floats(-3, 3), ANY),
    "repetition_penalty": st.one_of(st.floats(-1, 3), ANY),
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["0", "3", "25", "26", "-1", "x"]),
                                            st.one_of(st.integers(-150, 150), st.floats()), max_size=3), ANY),
    "seed": st.one_of(st.integers(-1, 5), ANY),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3), ANY),
    "stream": st.one_of(st.booleans(), ANY),
    "speculative": st.one_of(st.fixed_dictionaries({}, optional={
        "method": st.sampled_from(["ar", "auto", "sd-suffix", "sd-ngram", "nope"]),
        "k": st.integers(-1, 40)}), ANY),
}
COMPLETION = {**FIELDS, "prompt": st.one_of(TEXT, st.lists(st.integers(-1, 30), max_size=5), ANY),
              "logprobs": st.one_of(st.integers(-1, 22), ANY), "echo": st.one_of(st.booleans(), ANY),
              "prediction": st.one_of(TEXT, ANY)}
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "robot"]),
                                 "content": st.one_of(TEXT, ANY)})
CHAT_FIELDS = {**FIELDS, "messages": st.one_of(st.lists(MESSAGE, min_size=0, max_size=3), ANY),
               "logprobs": st.one_of(st.booleans(), ANY), "top_logprobs": st.one_of(st.integers(-1, 22), ANY),
               "prediction": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["content", "x"]),
                                                              "content": st.one_of(TEXT, ANY)}), ANY)}


def bodies(fields: dict) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


@pytest.fixture(scope="module")
def url():
    llm = toy_llm()
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=2, default_spec=SpecConfig("auto", 4)))
    with live(app) as (url, _):
        yield url


def check(url: str, path: str, body: dict) -> None:
    r = httpx.post(url + path, content=json.dumps(body), headers={"Content-Type": "application/json"},
                   timeout=30)  # json.dumps: NaN and Infinity go out as clients' encoders may send them
    assert r.status_code < 500, (body, r.status_code, r.text)
    assert "Traceback" not in r.text and "server_error" not in r.text, (body, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, (body, err)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(body=bodies(COMPLETION))
def test_fuzzed_completion_requests_never_fail_the_server(url, body):
    check(url, C, body)


@FUZZ
@given(body=bodies(CHAT_FIELDS))
def test_fuzzed_chat_requests_never_fail_the_server(url, body):
    check(url, CHAT, body)
