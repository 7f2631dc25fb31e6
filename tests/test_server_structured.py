"""Structured outputs and tool calls through the real `openai` client against a live
server (docs/server.md#structured-outputs, docs/server.md#tool-calls).

On the toy target (a JSON alphabet) every answer is exact: the server's constrained
answer under speculation is constrained plain decoding's. On real models: the
client's `parse` with a Pydantic model (SmolLM2), and a two-turn tool-calling loop
in Qwen2.5's own call format (the 0.5B coder), streamed and not.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from speclm import LLM, Grammar, SamplingParams, SpecConfig
from speclm.server import ServerConfig, create_app
from speclm.server.call_reading import BY_TOKEN, CallStream, parse_calls, token_tags

from .test_server import C, CHAT, client, live
from .test_structured import SCHEMA, toy

JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
USER = [{"role": "user", "content": '{"a": 1, "b": "ab"} '}]


@pytest.fixture(scope="module")
def served():
    llm = LLM(target=toy(), draft=toy(seed=5, order=1))
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=4, default_spec=SpecConfig("auto", 8)))
    with live(app) as (url, _):
        yield llm, url
    llm.close()


def constrained_ar(llm, grammar: Grammar, max_tokens: int = 120):
    ids = llm.target.tokenize_chat(USER)
    return llm.generate(ids, SamplingParams(max_new_tokens=max_tokens, temperature=0, grammar=grammar),
                        SpecConfig(method="ar"))


def test_a_json_schema_answer_is_constrained_plain_decodings_and_valid(served):
    llm, url = served
    r = client(url).chat.completions.create(model="toy", messages=USER, max_tokens=120, temperature=0,
                                            response_format=JSON_SCHEMA)
    answer = r.choices[0].message.content
    assert answer == constrained_ar(llm, Grammar.json_schema(SCHEMA)).text
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert r.choices[0].finish_reason == "stop" and r.usage.speculative["method"] == "auto"


@pytest.mark.parametrize("fmt,grammar", [
    ({"type": "json_object"}, Grammar.json_object()),
    ({"type": "regex", "regex": "(ab|ba){1,4}-[01]{2}"}, Grammar.regex("(ab|ba){1,4}-[01]{2}")),
    ({"type": "lark", "lark": 'start: "[" ("true" | "null") "]"'}, Grammar.lark('start: "[" ("true" | "null") "]"')),
])
def test_json_object_and_speclms_regex_and_lark_formats(served, fmt, grammar):
    llm, url = served
    r = client(url).chat.completions.create(model="toy", messages=USER, max_tokens=120, temperature=0,
                                            response_format=fmt)
    assert r.choices[0].message.content == constrained_ar(llm, grammar).text
    streamed = client(url).chat.completions.create(model="toy", messages=USER, max_tokens=120, temperature=0,
                                                   response_format=fmt, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content


def test_completions_take_a_response_format_too(served):
    llm, url = served
    r = httpx.post(url + C, json={"prompt": "ab", "max_tokens": 80, "temperature": 0,
                                  "response_format": {"type": "regex", "regex": "(ab|ba){1,4}-[01]{2}"}},
                   timeout=30).json()["choices"][0]
    params = SamplingParams(max_new_tokens=80, temperature=0, grammar=Grammar.regex("(ab|ba){1,4}-[01]{2}"))
    assert r["text"] == llm.generate(llm.encode("ab"), params, SpecConfig(method="ar")).text
    assert re.fullmatch("(ab|ba){1,4}-[01]{2}", r["text"]) and r["finish_reason"] == "stop"


def test_an_answer_cut_by_max_tokens_mid_object_says_length(served):
    _, url = served
    r = client(url).chat.completions.create(model="toy", messages=USER, max_tokens=4, temperature=0,
                                            response_format=JSON_SCHEMA)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)


@pytest.mark.parametrize("path,body,param,words", [
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}},
     "response_format", "cannot be compiled"),
    (CHAT, {"response_format": {"type": "regex", "regex": "a["}}, "response_format", "cannot be compiled"),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format", "needs response_format.json_schema"),
    (CHAT, {"response_format": {"type": "json_object", "regex": "a"}}, "response_format", "only read with"),
    (CHAT, {"response_format": {"type": "yaml"}}, "response_format", ""),
    (CHAT, {"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "ignore_eos"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g'"),
    (CHAT, {"tool_choice": "required"}, "tool_choice", "needs tools"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools", "twice"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", ""),
    (C, {"prompt": "ab", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "chat/completions"),
    (C, {"prompt": "ab", "tool_choice": "auto"}, "tool_choice", "chat/completions"),
])
def test_bad_formats_and_tool_fields_are_400s_naming_the_field(served, path, body, param, words):
    _, url = served
    body = {"max_tokens": 3, **({"messages": USER} if path == CHAT else {}), **body}
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


# ---- parsing the call format ------------------------------------------------------------
def test_calls_parse_and_anything_else_stays_content():
    text = 'Let me look.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n' \
           '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    content, calls = parse_calls(text, {"f", "g"})
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}),
                                                                                                ("g", {})]
    for broken in ['<tool_call>\n{"name": "h", "arguments": {}}\n</tool_call>',  # undeclared
                   '<tool_call>\n{"name": "f", "arguments": {"x": \n</tool_call>',  # not JSON
                   '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> and text']:
        assert parse_calls(broken, {"f", "g"}) == (broken, [])


def test_a_streamed_answer_holds_back_text_from_the_call_tag_on():
    stream, sent, deltas = CallStream({"f"}), [], []
    for piece in ["Sure", ". <tool", "_call>\n{\"name\": \"f\", ", '"arguments": {}}\n</tool_call>']:
        text, more = stream.feed(piece)
        sent.append(text)
        deltas += more
    assert "".join(sent) == "Sure. " and "<" not in "".join(sent)
    rest, more, calls = stream.finish()
    assert rest == "" and calls[0].name == "f" and calls[0].id == deltas[0]["id"]
    assert "".join(d["function"]["arguments"] for d in deltas + more) == "{}"
    plain = CallStream({"f"})
    assert plain.feed("a <tool") == ("a ", []) and plain.finish() == ("<tool", [], [])


def test_where_the_tags_are_tokens_only_the_tokens_open_and_close_calls():
    """BY_TOKEN: the engine shows the two tag tokens as U+FDD0 / U+FDD1 (SamplingParams.shown_as);
    the tags' text spelled in ordinary tokens is content, an argument may hold it, and content
    reaches the client with the tags spelled."""
    opening, closing = BY_TOKEN.open, BY_TOKEN.close
    text = (f'Write <tool_call> like this.{opening}\n{{"name": "f", "arguments": {{"s": "</tool_call>{{"}}}}\n'
            f'{closing}\n')
    content, calls = parse_calls(text, {"f"}, BY_TOKEN)
    assert content == "Write <tool_call> like this." and len(calls) == 1
    assert json.loads(calls[0].arguments) == {"s": "</tool_call>{"}
    spelled = 'Sure: <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'  # ordinary tokens: no call
    assert parse_calls(spelled, {"f"}, BY_TOKEN) == (spelled, [])
    broken = f'{opening}\n{{"name": "f", "arguments": {{}}}}\n{closing} and text'
    assert parse_calls(broken, {"f"}, BY_TOKEN) == ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> and text', [])
    stream, sent = CallStream({"f"}, BY_TOKEN), []
    for piece in ["a <tool", "_call> b", opening, '\n{"name": "f", "arguments": {}}', f"\n{closing}"]:
        sent.append(stream.feed(piece)[0])
    assert "".join(sent) == "a <tool_call> b" and [c.name for c in stream.finish()[2]] == ["f"]


def test_tags_are_read_by_token_only_where_each_is_one_token():
    vocab = {"<tool_call>": [7], "</tool_call>": [8]}
    tags, shown = token_tags(lambda text: vocab[text])
    assert tags is BY_TOKEN and shown == ((7, BY_TOKEN.open), (8, BY_TOKEN.close))
    tags, shown = token_tags(lambda text: [1, 2, 3])
    assert tags.open == "<tool_call>" and shown == ()


# ---- real models --------------------------------------------------------------------------
class Person(BaseModel):
    name: str
    age: int
    languages: list[str] = Field(max_length=3)


def test_the_openai_clients_parse_with_a_pydantic_model(smollm):
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    with live(app) as (url, _):
        r = client(url).beta.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": "Describe a programmer as JSON."}],
            response_format=Person, max_tokens=120, temperature=0)
        plain = client(url).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Describe a programmer as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "Person", "strict": True,
                                                                    "schema": {**Person.model_json_schema(),
                                                                               "additionalProperties": False}}},
            max_tokens=120, temperature=0, extra_body={"speculative": {"method": "ar"}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and r.choices[0].message.content == plain.choices[0].message.content


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen(qwen_small):
    app = create_app(qwen_small, ServerConfig(model_id="qwen", max_concurrency=2))
    with live(app) as (url, _):
        yield qwen_small, url


def test_a_two_turn_tool_loop_in_qwens_own_call_format(qwen):
    """call (tool_choice required: arguments valid under the schema), the tool's result
    rendered by the template as role tool, then the final answer as text."""
    _, url = qwen
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    first = client(url).chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME],
                                                tool_choice="required", parallel_tool_calls=False, max_tokens=80,
                                                temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time") and call.id.startswith("call_")
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    final = client(url).chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME],
                                                tool_choice="none", max_tokens=40, temperature=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    assert "<tool_call>" not in final.choices[0].message.content


def test_a_named_call_streamed_equals_it_unstreamed_and_plain_decoding(qwen):
    _, url = qwen
    kw = dict(model="qwen", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER, TIME],
              tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60, temperature=0)
    whole = client(url).chat.completions.create(**kw)
    ar = client(url).chat.completions.create(**kw, extra_body={"speculative": {"method": "ar"}})
    calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert calls == [(c.function.name, c.function.arguments) for c in ar.choices[0].message.tool_calls]
    assert calls[0][0] == "get_time" and "city" in json.loads(calls[0][1])
    deltas, reasons = [], []
    for chunk in client(url).chat.completions.create(**kw, stream=True):
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            reasons.append(chunk.choices[0].finish_reason)
    assert [(d.function.name, "".join(e.function.arguments for e in deltas if e.index == d.index))
            for d in deltas if d.id] == calls and reasons[-1] == "tool_calls"
    assert len(deltas) > 2  # the arguments came as the model wrote them, not as one piece at the end
    assert whole.usage.speculative["drafted"] > 0  # the forced call wrapper went in as drafts
