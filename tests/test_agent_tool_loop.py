"""A two-tool agent loop as pydantic-ai 2.78 sends it (bodies captured from it with
scripts/clients_pydantic_ai.py --log), on SmolLM2 through the generic tool-call format:
"required" with parallel calls ends on its own with calls, the turn that returns the
results (the assistant's `tool_calls`, a `tool` message per call) under "auto" is
answered with text (docs/server.md#tool-calls). The 1.5B target's agent runs, turn by
turn, are in docs/results.md#c59."""

from __future__ import annotations

import json

import pytest

from speclm.server import ServerConfig, create_app

from .test_instructor_requests import chat
from .test_server import live

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools when they help, "
                                       "then answer the user in one sentence."}
USER = {"role": "user", "content": "What is the weather in Paris right now?"}
TOOLS = [{"type": "function", "function": {
             "name": "get_weather", "description": "The current weather in a city.",
             "parameters": {"additionalProperties": False, "properties": {"city": {"type": "string"}},
                            "required": ["city"], "type": "object"}, "strict": True}},
         {"type": "function", "function": {
             "name": "convert_currency",
             "description": "Convert an amount of money between currencies given as ISO codes (USD, EUR, JPY).",
             "parameters": {"additionalProperties": False,
                            "properties": {"amount": {"type": "number"}, "source": {"type": "string"},
                                           "target": {"type": "string"}},
                            "required": ["amount", "source", "target"], "type": "object"}, "strict": True}}]


def body(messages: list[dict], tool_choice: str, **extra) -> dict:
    """OpenAIChatModel's request: model, stream, messages, max_completion_tokens, settings, tools."""
    return {"model": "smollm2", "stream": False, "messages": messages, "max_completion_tokens": 200,
            "temperature": 0, "tool_choice": tool_choice, "tools": TOOLS, **extra}


@pytest.fixture(scope="module")
def url(smollm):
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    with live(app) as (address, _):
        yield address


def test_required_with_parallel_calls_ends_with_calls(url):
    choice = chat(url, body([SYSTEM, USER], "required", parallel_tool_calls=True))
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and calls and choice["message"]["content"] is None
    for call in calls:
        assert call["function"]["name"] in {"get_weather", "convert_currency"}
        json.loads(call["function"]["arguments"])


def test_the_results_turn_is_answered_with_text(url):
    call = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    messages = [SYSTEM, USER, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": "Paris: 18 °C, light rain"}]
    choice = chat(url, body(messages, "auto"))
    assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"], choice
    assert "<tool_response>" not in choice["message"]["content"]

