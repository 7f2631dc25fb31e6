"""Issue 57's hostile bodies against a live SmolLM2 server (docs/server.md): grammars
that crashed llguidance or failed after the 200, logit_bias conflicting with a grammar or
banning everything, and the 400s that named no field. Each answer is a 400 naming its
field before any response starts, or a 200 that ends cleanly; /health answers within 2 s
after every one."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from speclm.server import ServerConfig, create_app

from .test_grammar_safety import chain, lark_chain
from .test_server import C, CHAT, live

U = [{"role": "user", "content": "Give three digits."}]
DIGIT_IDS = [str(t) for t in range(32, 42)]  # SmolLM2's "0".."9"
EOS_IDS = ["0", "2", "4"]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def js(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.fixture(scope="module")
def served(smollm):
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    with live(app) as (url, _):
        yield url, app.state.speclm


def post(url: str, path: str, body: dict, stream: bool = False) -> tuple[int, dict | list]:
    data = json.dumps({**body, **({"stream": True} if stream else {})}).encode("utf-8", "surrogatepass")
    r = httpx.post(url + path, content=data, headers={"Content-Type": "application/json"}, timeout=60)
    if r.status_code == 200 and stream:
        return 200, [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return r.status_code, r.json()


def healthy(url: str, state) -> None:
    t = time.perf_counter()
    assert httpx.get(url + "/health", timeout=2).status_code == 200 and time.perf_counter() - t < 2
    assert state.engine.alive


GRAMMAR_400S = [
    (CHAT, {"response_format": js(chain(1000))}, "response_format", "nests deeper"),
    (CHAT, {"response_format": js(chain(2000))}, "response_format", "nests deeper"),
    (CHAT, {"response_format": js(chain(10_000))}, "response_format", "characters long"),
    (C, {"prompt": "x", "response_format": {"type": "lark", "lark": lark_chain(5000)}}, "response_format",
     "chains rule references"),
    (CHAT, {"response_format": {"type": "regex", "regex": "((a{100}b){100}c){100}"}}, "response_format",
     "repeats a pattern"),
    (CHAT, {"response_format": js({"anyOf": [{"const": [i]} for i in range(5000)]})}, "response_format",
     "max is 2000"),
    (CHAT, {"response_format": {"type": "lark", "lark": "start: " + " | ".join(f'"w{i}" "x{i}"' for i in range(5000))}},
     "response_format", "max is 2000"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": chain(1000)}}],
            "tool_choice": "required"}, "tools", "speclm's limit"),
]
CONFLICTS = [
    (CHAT, {"temperature": 0, "logit_bias": {"81": 100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}},
     "the response_format grammar does not allow"),
    (CHAT, {"temperature": 1, "logit_bias": {"81": 100}, "response_format": {"type": "regex", "regex": "[0-9]{3}"}},
     "the response_format grammar does not allow"),
    (C, {"prompt": "Digits:", "logit_bias": {t: -100 for t in DIGIT_IDS},
         "response_format": {"type": "regex", "regex": "[0-9]{3}"}}, "every token the response_format grammar allows"),
    (C, {"prompt": "Hello", "temperature": 0, "logit_bias": {str(t): -100 for t in range(49152)}},
     "every token of the vocabulary"),
    (C, {"prompt": "Hello", "temperature": 1, "logit_bias": {str(t): -100 for t in range(49152)}},
     "every token of the vocabulary"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body,param,words", GRAMMAR_400S)
def test_grammars_over_the_bounds_or_llguidances_limits_are_400s_before_any_answer(served, path, body, param,
                                                                                    words, stream):
    url, state = served
    status, err = post(url, path, {"max_tokens": 4, **({"messages": U} if path == CHAT else {}), **body}, stream)
    assert status == 400 and err["error"]["param"] == param and words in err["error"]["message"], err
    healthy(url, state)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body,words", CONFLICTS)
def test_a_bias_that_leaves_no_first_token_is_a_400_naming_logit_bias(served, path, body, words, stream):
    url, state = served
    status, err = post(url, path, {"max_tokens": 6, **({"messages": U} if path == CHAT else {}), **body}, stream)
    assert status == 400 and err["error"]["param"] == "logit_bias" and words in err["error"]["message"], err
    healthy(url, state)


@pytest.mark.parametrize("temperature", [0, 1])
def test_a_row_emptied_later_ends_the_answer_with_content_filter(served, temperature):
    """+100 on every digit, -100 on the end tokens: three digits, then the grammar allows
    only an end token, which is banned: the answer stops there, streamed or not."""
    url, state = served
    body = {"prompt": "Digits:", "max_tokens": 8, "temperature": temperature,
            "logit_bias": {**{t: 100 for t in DIGIT_IDS}, **{t: -100 for t in EOS_IDS}},
            "response_format": {"type": "regex", "regex": "[0-9]{3}"}}
    status, r = post(url, C, body)
    assert status == 200 and r["choices"][0]["finish_reason"] == "content_filter", r
    assert len(r["choices"][0]["text"]) == 3 and r["choices"][0]["text"].isdigit()
    status, events = post(url, CHAT, {**{k: v for k, v in body.items() if k != "prompt"}, "messages": U}, stream=True)
    assert status == 200 and not any("error" in e for e in events), events
    assert events[-1]["choices"][0]["finish_reason"] == "content_filter"
    healthy(url, state)


@pytest.mark.parametrize("path,body,param", [
    (C, {"prompt": "Hi", "logit_bias": {" 12 ": 5}}, "logit_bias"),
    (C, {"prompt": "Hi", "logit_bias": {"00012": 5}}, "logit_bias"),
    (C, {"prompt": "Hi", "logit_bias": {"\u0661\u0662": 5}}, "logit_bias"),
    (C, {"prompt": "Hi", "logit_bias": {"+12": 5}}, "logit_bias"),
    (C, {"prompt": "Hi", "logit_bias": {"9" * 5000: 5}}, "logit_bias"),
    (CHAT, {"messages": U, "prediction": {"type": "content", "content": "a\ud800b"}}, "prediction"),
    (C, {"prompt": "Hi", "prediction": "a\ud800b"}, "prediction"),
    (C, {"prompt": "a\ud800b"}, "prompt"),
    (CHAT, {"messages": [{"role": "user", "content": "a\udfffb"}]}, "messages"),
])
def test_every_400_names_its_field(served, path, body, param):
    url, state = served
    status, err = post(url, path, {"max_tokens": 2, **body})
    assert status == 400 and err["error"]["param"] == param, err
    healthy(url, state)


def test_logit_bias_keys_are_read_as_openai_writes_them(served):
    url, _ = served
    status, r = post(url, C, {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "logit_bias": {"12": 100}})
    assert status == 200 and r["usage"]["completion_tokens"] == 2


def test_a_named_tool_choice_without_tool_calls_in_the_template_is_served_like_the_unnamed_one(served):
    # SmolLM2's template writes no tool calls: both go through the generic format (docs/server.md)
    url, _ = served
    named = post(url, CHAT, {"messages": U, "max_tokens": 40, "temperature": 0, "tools": [TOOL],
                             "tool_choice": {"type": "function", "function": {"name": "f"}}})
    unnamed = post(url, CHAT, {"messages": U, "max_tokens": 40, "temperature": 0, "tools": [TOOL]})
    assert named[0] == 200 and unnamed[0] == 200
    message = named[1]["choices"][0]["message"]
    assert (message["tool_calls"] or [{}])[0].get("function", {}).get("name") == "f" \
        or named[1]["choices"][0]["finish_reason"] == "length", "a named call is either whole or cut by max_tokens"


def test_error_messages_never_name_the_servers_model_path(served, smollm):
    url, _ = served
    status, err = post(url, C, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"99999": 1}})
    path = str(smollm.target.path)
    assert status == 400 and path not in err["error"]["message"] and smollm.target.path.name in err["error"]["message"]


def test_echo_without_logprobs_echoes_the_prompt(served, smollm):
    url, _ = served
    status, r = post(url, C, {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "echo": True})
    plain = post(url, C, {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})[1]
    assert status == 200 and r["choices"][0]["text"] == "Once upon a time" + plain["choices"][0]["text"]
    assert r["choices"][0]["logprobs"] is None
    ids = smollm.encode("Once upon a time")
    status, r = post(url, C, {"prompt": ids, "max_tokens": 3, "temperature": 0, "echo": True})
    assert status == 200 and r["choices"][0]["text"].startswith("Once upon a time")
