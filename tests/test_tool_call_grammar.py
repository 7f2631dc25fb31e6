"""The tool-call grammar on the model's own call tokens (docs/server.md#tool-calls):
parameters' `$defs`/`$ref` resolve though the arguments sit nested in the call object;
under "auto" text may come before the calls; the call region ends after the last call
(a trailing newline, then the end of the turn)."""

from __future__ import annotations

import enum

import pytest
from pydantic import BaseModel

from speclm.constraints import GrammarMask
from speclm.server.tools import FunctionDef, ToolDef, arguments_schema, call_grammar


class Priority(enum.Enum):
    low = "low"
    high = "high"


class Owner(BaseModel):
    name: str


class Task(BaseModel):
    title: str
    priority: Priority
    owner: Owner


def tool(name: str, parameters: dict | None = None) -> ToolDef:
    return ToolDef(type="function", function=FunctionDef(name=name, parameters=parameters))


def test_defs_are_hoisted_and_other_local_refs_follow_the_arguments():
    schema = {"$defs": {"P": {"enum": ["a"]}, "Q": {"$ref": "#/properties/x"}},
              "properties": {"x": {"$ref": "#/$defs/P"}, "me": {"$ref": "#"}}}
    arguments, hoisted = arguments_schema(schema)
    assert arguments == {"properties": {"x": {"$ref": "#/$defs/P"}, "me": {"$ref": "#/properties/arguments"}}}
    assert hoisted == {"$defs": {"P": {"enum": ["a"]}, "Q": {"$ref": "#/properties/arguments/properties/x"}}}


def accepts(grammar, backend, text: str, end: bool = True) -> bool:
    """Whether the grammar takes `text` (tokenized with its control tokens) and, with `end`, may stop there."""
    mask = GrammarMask(grammar, backend)
    ids = backend.tokenize(text, add_special=False, special=True)
    if mask.valid_prefix(ids) != len(ids):
        return False
    for t in ids:
        mask.matcher.consume_token(t)
    return mask.matcher.is_accepting() if end else True


CALL = '<tool_call>\n{"name": "add_task", "arguments": {"title": "x", "priority": "high", "owner": {"name": "a"}}}' \
       '\n</tool_call>'


def test_a_pydantic_model_with_an_enum_and_a_nested_model_compiles_and_binds(qwen_small):
    target = qwen_small.target
    tools = [tool("add_task", Task.model_json_schema())]
    required = call_grammar(tools, "required", None, None)
    assert accepts(required, target, CALL)
    assert not accepts(required, target, CALL.replace('"high"', '"urgent"'), end=False)


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_the_call_region_ends_after_the_last_call_and_its_newline(qwen_small, choice):
    target = qwen_small.target
    grammar = call_grammar([tool("add_task", Task.model_json_schema()), tool("ping")], choice, None, None)
    assert accepts(grammar, target, CALL + "\n")
    assert accepts(grammar, target, CALL + "\n" + CALL)
    ping = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    assert accepts(grammar, target, CALL + ping + "\n")


def test_auto_takes_text_before_the_calls_and_text_alone(qwen_small):
    target = qwen_small.target
    grammar = call_grammar([tool("add_task", Task.model_json_schema())], "auto", None, None)
    assert accepts(grammar, target, "Let me add it.\n" + CALL)
    assert accepts(grammar, target, "No call needed: 4.")
    assert not accepts(grammar, target, CALL + " and more text", end=False)
