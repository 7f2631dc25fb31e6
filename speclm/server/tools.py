"""Tool calls on the OpenAI API (docs/server.md#tool-calls): `tools` and `tool_choice`
shown to the model through its own chat template, the call format constrained by a
grammar, and the answer parsed back into OpenAI `tool_calls`.

The call format is the model's own where its template has one: Hermes/Qwen2.5's
`<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` (CALL_OPEN and CALL_CLOSE
are single tokens in such a vocabulary); any other template gets the same shape spelled
as text (generic_tools.py).

What the grammar (a Lark grammar, llguidance's dialect) allows:
- tool_choice "none": text only (the call token is never emitted);
- "auto": free text, then optionally calls (the grammar starts constraining at the call
  token); with response_format, that answer or calls;
- "required": one or more calls (one if parallel_tool_calls is false);
- a named function: one call of it.
Every call's arguments follow its function's parameters (`$defs` hoisted); the region
ends after a call and at most two newlines. Forced runs ({"name": ", the function's name
when only one is left, "arguments": ...) are drafted for free (docs/design.md#structured-outputs).
Calls are read back by call_reading.py.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..constraints import JSON_LAYOUT, Grammar
from ..errors import InvalidRequestError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_STRICT = ConfigDict(strict=True, extra="forbid")


class FunctionDef(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = _STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call in an assistant message the client sends back (or speclm answers)."""

    model_config = ConfigDict(strict=True, extra="allow")
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def as_template_input(self, where: str) -> dict:
        """The call as chat templates read it: arguments as a JSON object (HF's convention)."""
        try:
            arguments = json.loads(self.function.arguments)
        except json.JSONDecodeError as exc:
            raise bad(f"{where}.function.arguments is not JSON text: {exc}", "messages") from None
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": arguments}}


def bad(message: str, param: str) -> InvalidRequestError:
    err = InvalidRequestError(message)
    err.param = param  # api_errors.api_error answers it as a 400 naming the field
    return err


def tools_supported(template: str) -> bool:
    """Whether a chat template renders tools and writes calls in the Hermes/Qwen2.5 format."""
    return CALL_OPEN in template and "tools" in template


def check_choice(tools: list[ToolDef], choice: ToolChoice | None) -> None:
    """400s for a tool_choice that names no declared function, or asks for calls without tools."""
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise bad(f"tools declares function {dup!r} twice: give each function one name", "tools")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad(f"tool_choice names function {choice.function.name!r}, which tools does not declare "
                  f"(declared: {', '.join(names) or 'none'})", "tool_choice")
    if choice == "required" and not tools:
        raise bad('tool_choice "required" needs tools: declare at least one function', "tool_choice")


_DEFS = ("$defs", "definitions")  # where JSON Schema keeps the subschemas a `$ref` names


def _rebased(node: Any, at: str) -> Any:
    """`node` with each local `$ref` ("#/...") rewritten for the schema moved to JSON pointer
    `at` of a new root; references into its `$defs`/`definitions` stay put (they are hoisted)."""
    if isinstance(node, list):
        return [_rebased(v, at) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            hoisted = any(value == f"#/{d}" or value.startswith(f"#/{d}/") for d in _DEFS)
            out[key] = value if hoisted else "#" + at + value[1:]
        else:
            out[key] = _rebased(value, at)
    return out


def arguments_schema(parameters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the arguments' schema, what to hoist to the call schema's root) for a function's
    `parameters` nested at /properties/arguments of the call object: `$defs` and
    `definitions` move to the root and every other local `$ref` points into the new place,
    so references resolve wherever they sat (Pydantic puts enums and nested models there)."""
    moved = _rebased(parameters, "/properties/arguments")
    return {k: v for k, v in moved.items() if k not in _DEFS}, {k: moved[k] for k in _DEFS if k in moved}


def _call_rule(function: FunctionDef, tokens: bool = True) -> str:
    """A Lark rule body for one call of `function`: the JSON object the format writes,
    its arguments valid under the function's `parameters` (none given: any object), between
    the call tokens (`tokens`) or the tags spelled as text (the generic format)."""
    arguments, hoisted = arguments_schema(function.parameters or {"type": "object"})
    schema = {"type": "object", "properties": {"name": {"const": function.name}, "arguments": arguments},
              "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT,
              **hoisted}
    opening, closing = (CALL_OPEN, CALL_CLOSE) if tokens else (f'"{CALL_OPEN}"', f'"{CALL_CLOSE}"')
    return f'{opening} "\\n" %json {json.dumps(schema)} "\\n" {closing}'


def call_grammar(tools: list[ToolDef], choice: ToolChoice | None, parallel: bool | None,
                 answer: Grammar | None, tokens: bool = True) -> Grammar | None:
    """The grammar of the answer under tool_choice; `answer` is response_format's grammar
    for a text answer (None: free text). Calls are always constrained to their functions'
    parameters; under "auto" without response_format, free text comes first and is not
    constrained until the model writes the call token (the grammar's lazy start); the call
    region ends after any call, whitespace and the end of the turn. `tokens`: the tags are the
    vocabulary's call tokens; else (the generic format) text, and "auto" without
    response_format is free text, its calls parsed afterwards."""
    choice = choice or "auto"
    if not tools or choice == "none":
        return answer or (Grammar.lark(f"start: TEXT\n{_TEXT}") if tokens else None)  # never the call token
    if isinstance(choice, NamedToolChoice):
        chosen = next(t.function for t in tools if t.function.name == choice.function.name)
        return Grammar.lark(f"start: {_call_rule(chosen, tokens)} SEP?\n{_SEP}")
    rules = [f"call_{i}: {_call_rule(t.function, tokens)}" for i, t in enumerate(tools)]
    calls = "call (SEP? call)* SEP?" if parallel is not False else "call SEP?"
    body = f"calls: {calls}\ncall: {' | '.join(f'call_{i}' for i in range(len(tools)))}\n" + \
        "\n".join(rules) + f"\n{_SEP}"
    if choice == "required":
        return Grammar.lark("start: calls\n" + body)
    if answer is None and not tokens:
        return None
    if answer is None:  # free text, then maybe calls: llguidance never lets TEXT spell the call token
        return Grammar.lark(f"start: TEXT calls?\n{_TEXT}" + body)
    return Grammar.lark(f"start: answer | calls\n{_answer_rule(answer)}" + body)


_SEP = "SEP: /[ \\t]*\\n{1,2}/\n"  # between and after calls: bounded, so the turn must end
_TEXT = "TEXT: /(?s:.*)/\n"


def _answer_rule(answer: Grammar | None) -> str:
    """The Lark rule `answer` for a text answer: free text, or response_format's JSON schema."""
    if answer is None:
        return f"answer: TEXT\n{_TEXT}"
    if answer.kind != "json_schema":
        raise bad(f"response_format of type {answer.kind!r} cannot be combined with tools unless tool_choice "
                  'is "none": use a json_schema, or send the tools in another request', "response_format")
    schema = {**json.loads(answer.text), "x-guidance": JSON_LAYOUT}
    return f"answer: %json {json.dumps(schema)}\n"
