"""Whether a structured answer is valid, checked apart from the grammar engine that
constrained it: extract's answer parses as JSON and validates under its schema
(jsonschema); tool-call's answer is calls in the model's format (its prompts ask
for one: tool_choice "required"), each naming a declared function with arguments
valid under its parameters."""

from __future__ import annotations

import json

import jsonschema

from ...server.call_reading import parse_calls


def answer_valid(prompt, text: str) -> bool:
    """`text` against what prompt (a workloads.Prompt with a grammar) asks for."""
    if prompt.tools:
        tools = {t["function"]["name"]: t["function"].get("parameters") or {} for t in json.loads(prompt.tools)}
        _, calls = parse_calls(text, set(tools))
        return bool(calls) and all(_valid(json.loads(c.arguments), tools[c.name]) for c in calls)
    if prompt.grammar.kind != "json_schema":
        return True  # regex and Lark grammars: the engine is the only judge here
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return _valid(value, json.loads(prompt.grammar.text))


def _valid(value, schema: dict) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True
