"""Tool calls written as JSON text under tool_choice "auto" (docs/server.md#calls-written-as-json-text):
Qwen2.5-Coder-1.5B answers a call as a fenced ```json block; such an answer is calls, in
the chat route's non-streamed body and its SSE events alike, while anything the rule does
not read as calls (another fence, an undeclared tool, text after the block) stays content
exactly as written, and a ```python answer still streams as it is written."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from speclm.metrics import GenerationResult
from speclm.server.http import _events
from speclm.server.responses import response_body
from speclm.server.schemas import ChatCompletionRequest
from speclm.server.text_calls import CallSpec, TextCallStream, read_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
CONVERT = {"type": "function", "function": {"name": "convert_currency", "parameters": {
    "type": "object", "properties": {"amount": {"type": "number"}, "source": {"type": "string"},
                                     "target": {"type": "string"}}, "required": ["amount", "source", "target"]}}}
FENCED = 'I will check.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PYTHON = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nCall it with two numbers."


def chat(tool_choice=None, tools=(WEATHER, CONVERT)) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": list(tools)}
    return ChatCompletionRequest.model_validate(body if tool_choice is None else {**body, "tool_choice": tool_choice})


def result(text: str, finish_reason: str = "stop") -> GenerationResult:
    return GenerationResult(text=text, token_ids=list(range(len(text))), finish_reason=finish_reason,
                            prompt_tokens=5, method="ar", k=0)


def answered(text: str, req: ChatCompletionRequest) -> dict:
    """The route's non-streamed chat answer's choice for a model that wrote `text`."""
    return response_body("chatcmpl-1", "m", [result(text)], True, req.call_spec())["choices"][0]


class Scripted:
    """A Handle whose model writes `pieces`, one delta each."""

    served_by = None
    done = True

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    async def astream(self):
        for piece in self.pieces:
            yield piece

    async def aresult(self) -> GenerationResult:
        return result("".join(self.pieces))

    def cancel(self) -> None:
        pass


def streamed(text: str, req: ChatCompletionRequest, size: int = 3) -> list[dict]:
    """The deltas (and last finish_reason) of the route's SSE answer, `text` written `size` characters at a time."""
    front = SimpleNamespace(model_id="m", config=SimpleNamespace(request_timeout_s=30))

    async def collect() -> list[str]:
        return [e async for e in _events(front, Scripted([text[i:i + size] for i in range(0, len(text), size)]),
                                         "chatcmpl-1", True, 1e12, False, req.call_spec())]
    events = [json.loads(e[len("data: "):]) for e in asyncio.run(collect()) if "[DONE]" not in e]
    return [e["choices"][0] for e in events[1:]]  # after the role chunk


def assembled(choices: list[dict]) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) as a client assembles the stream."""
    content, calls = "", {}
    for c in choices:
        content += c["delta"].get("content") or ""
        for d in c["delta"].get("tool_calls") or []:
            call = calls.setdefault(d["index"], ["", ""])
            call[0] += d.get("function", {}).get("name") or ""
            call[1] += d.get("function", {}).get("arguments") or ""
    return content, [tuple(calls[i]) for i in sorted(calls)], choices[-1]["finish_reason"]


def calls_of(choice: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]


def test_a_fenced_json_call_is_a_tool_call_and_the_prose_before_it_content():
    choice = answered(FENCED, chat())
    assert calls_of(choice) == [("get_weather", {"city": "Paris"})]
    assert choice["message"]["content"] == "I will check.\n" and choice["finish_reason"] == "tool_calls"


def test_a_bare_json_call_is_a_tool_call_with_null_content():
    choice = answered(BARE, chat("auto"))
    assert calls_of(choice) == [("get_weather", {"city": "Paris"})]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"


def test_an_array_or_several_blocks_are_parallel_calls_and_parameters_reads_as_arguments():
    spec = chat().call_spec()
    array = '```json\n[{"name": "get_weather", "arguments": {"city": "Oslo"}},\n' \
            ' {"name": "convert_currency", "parameters": {"amount": 5, "source": "EUR", "target": "USD"}}]\n```'
    blocks = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```\n' \
             '```\n{"name": "get_weather", "arguments": {"city": "Rome"}}'  # the answer ended in the fence
    assert [(c.name, json.loads(c.arguments)) for c in read_calls(array, spec)[1]] == \
        [("get_weather", {"city": "Oslo"}), ("convert_currency", {"amount": 5, "source": "EUR", "target": "USD"})]
    assert [json.loads(c.arguments)["city"] for c in read_calls(blocks, spec)[1]] == ["Oslo", "Rome"]


@pytest.mark.parametrize("text", [
    '```json\n{"name": "get_time", "arguments": {"city": "Paris"}}\n```',  # an undeclared tool
    '```json\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n```',  # arguments off its schema
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 1}\n```',  # a key too many
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nThat is how you call it.',  # text after
    '```json\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n```',  # "name" not first
    'Call it as {"name": "get_weather", "arguments": {"city": "Paris"}}',  # not from a line's start
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}\n```',  # not JSON
    PYTHON,
])
def test_what_is_not_a_call_stays_content_exactly(text):
    for req in (chat(), chat("auto")):
        choice = answered(text, req)
        assert (choice["message"]["content"], choice["message"]["tool_calls"], choice["finish_reason"]) == \
            (text, None, "stop")
        assert assembled(streamed(text, req)) == (text, [], "stop")


def test_tool_choice_none_never_converts():
    req = chat("none")
    assert req.call_spec() is None
    choice = answered(FENCED, req)
    assert (choice["message"]["content"], choice["message"]["tool_calls"], choice["finish_reason"]) == \
        (FENCED, None, "stop")
    assert assembled(streamed(FENCED, req)) == (FENCED, [], "stop")


def test_only_auto_reads_json_text_as_calls():
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert chat().call_spec().text_form and chat("auto").call_spec().text_form
    assert not chat("required").call_spec().text_form and not chat(named).call_spec().text_form
    assert answered(BARE, chat("required"))["message"]["content"] == BARE  # its grammar writes the call format


@pytest.mark.parametrize("size", [1, 4, 64])
def test_a_streamed_fenced_call_assembles_to_the_unstreamed_one(size):
    choice = answered(FENCED, chat())
    content, calls, finish = assembled(streamed(FENCED, chat(), size))
    assert (content, finish) == (choice["message"]["content"], "tool_calls")
    assert [(n, json.loads(a)) for n, a in calls] == calls_of(choice)


def test_a_python_answer_streams_as_written_holding_back_only_the_fence_tag():
    stream, sent = TextCallStream(chat().call_spec()), ""
    for i, ch in enumerate(PYTHON):
        content, deltas = stream.feed(ch)
        sent += content
        assert not deltas
        assert len(PYTHON[:i + 1]) - len(sent) <= len("\n```pyt")  # never more than a fence's opening held
    rest, deltas, calls = stream.finish()
    assert sent + rest == PYTHON and not deltas and not calls


def test_a_possible_call_is_held_until_the_text_after_it_settles_it():
    stream = TextCallStream(chat().call_spec())
    assert stream.feed("Plan:\n```js") == ("Plan:\n", [])  # "```js" may still be ```json
    assert stream.feed("on\n{\"name\": \"get_w")[0] == ""
    assert stream.feed('eather", "arguments": {"city": "Paris"}}\n```\n')[0] == ""
    assert stream.feed("Done")[0].startswith("```json")  # text after the block: it was content all along
    assert stream.finish() == ("", [], [])
