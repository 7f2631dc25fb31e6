"""Tool calls as agents send them, on Qwen2.5-Coder-0.5B's own call tokens, through the
`openai` client (docs/server.md#tool-calls): a Pydantic model with an enum and a nested
model as parameters (instructor's TOOLS mode: `$defs`), "required" with parallel calls
stopping on its own, the streamed name and argument deltas assembling into the
unstreamed call, and every answer's greedy text (and tokens) equal to method ar's."""

from __future__ import annotations

import json

import jsonschema
import pytest

from speclm.server import ServerConfig, create_app

from .test_server import client, live
from .test_tool_call_grammar import Task

ADD_TASK = {"type": "function", "function": {"name": "add_task", "description": "Add a task to the tracker",
                                             "parameters": Task.model_json_schema()}}
PING = {"type": "function", "function": {"name": "ping", "description": "Check that a host is up",
                                         "parameters": {"type": "object", "properties": {"host": {"type": "string"}},
                                                        "required": ["host"]}}}
USER = [{"role": "user", "content": "Add a high priority task 'ship it' owned by Ana, and ping example.com."}]


@pytest.fixture(scope="module")
def url(qwen_small):
    app = create_app(qwen_small, ServerConfig(model_id="qwen", max_concurrency=2))
    with live(app) as (address, _):
        yield address


def ask(url: str, method: str, max_tokens: int = 120, **kw):
    return client(url).chat.completions.create(model="qwen", messages=USER, temperature=0, max_tokens=max_tokens,
                                               logprobs=True, extra_body={"speculative": {"method": method}}, **kw)


def same(a, b) -> None:
    """Greedy answers identical: content, calls, finish, and the same tokens logprobs were
    reported for (their values differ by the block forward's rounding: Qwen's llama.cpp
    forward over a grammar's forced run is not batch-invariant: an open finding of issue 59)."""
    ma, mb = a.choices[0].message, b.choices[0].message
    assert (ma.content, a.choices[0].finish_reason) == (mb.content, b.choices[0].finish_reason)
    assert [(c.function.name, c.function.arguments) for c in ma.tool_calls or []] == \
        [(c.function.name, c.function.arguments) for c in mb.tool_calls or []]
    assert [t.token for t in a.choices[0].logprobs.content] == [t.token for t in b.choices[0].logprobs.content]


def test_a_named_call_with_defs_validates_and_equals_ar(url):
    named = {"type": "function", "function": {"name": "add_task"}}
    sd, ar = (ask(url, m, tools=[ADD_TASK], tool_choice=named) for m in ("sd-ngram", "ar"))
    same(sd, ar)
    call = sd.choices[0].message.tool_calls[0]
    Task.model_validate_json(call.function.arguments)
    assert sd.choices[0].finish_reason == "tool_calls"


def test_required_with_parallel_calls_stops_on_its_own(url):
    sd, ar = (ask(url, m, tools=[ADD_TASK, PING], tool_choice="required", max_tokens=300) for m in ("sd-ngram", "ar"))
    same(sd, ar)
    choice = sd.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    for call in choice.message.tool_calls:
        schema = (ADD_TASK if call.function.name == "add_task" else PING)["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_auto_answers_exactly_and_streams_the_same_calls(url):
    sd, ar = (ask(url, m, tools=[ADD_TASK, PING], tool_choice="auto", max_tokens=160) for m in ("sd-ngram", "ar"))
    same(sd, ar)
    whole = sd.choices[0].message
    deltas, content = [], ""
    for chunk in client(url).chat.completions.create(model="qwen", messages=USER, temperature=0, max_tokens=160,
                                                     tools=[ADD_TASK, PING], tool_choice="auto", stream=True):
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            content += chunk.choices[0].delta.content or ""
    streamed = [(d.function.name, "".join(e.function.arguments or "" for e in deltas if e.index == d.index))
                for d in deltas if d.id]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.tool_calls or []]
    assert content == (whole.content or "")
