"""Tool calls on the OpenAI API (docs/server.md#tool-calls): `tools` and `tool_choice`
shown to the model through its own chat template, the call format constrained by a
grammar, and the answer parsed back into OpenAI `tool_calls`.

The call format is the model's own: speclm serves templates that write calls as
Hermes/Qwen2.5 do, `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`
(CALL_OPEN and CALL_CLOSE are single tokens in such a vocabulary). A template
without that format serves no tools (a 400 naming `tools`).

What the grammar (a Lark grammar, llguidance's dialect) allows:
- tool_choice "none": text only (the call token is never emitted);
- "auto": text, or calls; a call's arguments follow its function's JSON schema
  when the function is `strict`, else any JSON object;
- "required": one or more calls (one if parallel_tool_calls is false), every
  arguments object following its schema;
- a named function: one call of it, following its schema.
Forced runs ({"name": ", the function's name when only one is left, "arguments": ...)
are drafted for free (docs/design.md#structured-outputs).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
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
    err.param = param  # schemas.api_error answers it as a 400 naming the field
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


def _call_rule(function: FunctionDef, constrained: bool) -> str:
    """A Lark rule body for one call of `function`: the JSON object the format writes."""
    arguments = (function.parameters or {"type": "object"}) if constrained else {"type": "object"}
    schema = {"type": "object", "properties": {"name": {"const": function.name}, "arguments": arguments},
              "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_LAYOUT}
    return f'<{CALL_OPEN[1:-1]}> "\\n" %json {json.dumps(schema)} "\\n" <{CALL_CLOSE[1:-1]}>'


def call_grammar(tools: list[ToolDef], choice: ToolChoice | None, parallel: bool | None,
                 answer: Grammar | None) -> Grammar | None:
    """The grammar of the answer under tool_choice; `answer` is response_format's grammar
    for a text answer (None: free text). None: nothing to constrain ("auto" with no strict
    function and no response_format)."""
    choice = choice or "auto"
    if not tools or choice == "none":
        return answer or Grammar.lark(f"start: TEXT\n{_TEXT}")  # never the call token
    if isinstance(choice, NamedToolChoice):
        chosen = next(t.function for t in tools if t.function.name == choice.function.name)
        return Grammar.lark(f"start: {_call_rule(chosen, True)}\n")
    required = choice == "required"
    if not required and answer is None and not any(t.function.strict for t in tools):
        return None
    rules = [f"call_{i}: {_call_rule(t.function, required or bool(t.function.strict))}" for i, t in enumerate(tools)]
    calls = 'call ("\\n" call)*' if parallel is not False else "call"
    body = f"calls: {calls}\ncall: {' | '.join(f'call_{i}' for i in range(len(tools)))}\n" + "\n".join(rules) + "\n"
    if required:
        return Grammar.lark("start: calls\n" + body)
    return Grammar.lark(f"start: answer | calls\n{_answer_rule(answer)}" + body)


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


@dataclass
class ParsedCall:
    name: str
    arguments: str
    id: str

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_calls(text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of an answer: the text before the first CALL_OPEN is content; each
    CALL_OPEN ... CALL_CLOSE block holding {"name": a declared function, "arguments": an
    object} is a call. An answer whose blocks do not all parse stays content, whole."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    calls, rest = [], text[start:]
    while rest.strip():
        rest = rest.lstrip()
        if not rest.startswith(CALL_OPEN):
            return text, []
        end = rest.find(CALL_CLOSE)
        body = rest[len(CALL_OPEN):end if end >= 0 else len(rest)]
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or obj.get("name") not in names or not isinstance(obj.get("arguments"), dict):
            return text, []
        calls.append(ParsedCall(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False),
                                "call_" + uuid.uuid4().hex[:24]))
        rest = rest[end + len(CALL_CLOSE):] if end >= 0 else ""
    content = text[:start]
    return (content if content.strip() else None), calls


class CallStream:
    """Splits a streamed answer: text before CALL_OPEN streams as content; from CALL_OPEN
    on it is held back and parsed once the answer ends (`finish`)."""

    def __init__(self, names: set[str]):
        self.names, self.text, self.sent = names, "", 0

    def feed(self, delta: str) -> str:
        """The content that can be sent now (a possible start of CALL_OPEN is held back)."""
        self.text += delta
        cut = self.text.find(CALL_OPEN)
        if cut < 0:
            cut = len(self.text)
            for k in range(len(CALL_OPEN) - 1, 0, -1):  # the text may end with a prefix of the tag
                if self.text.endswith(CALL_OPEN[:k]):
                    cut -= k
                    break
        out, self.sent = self.text[self.sent:max(cut, self.sent)], max(cut, self.sent)
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """(content not yet sent, calls): when the held text does not parse as calls, it is content."""
        content, calls = parse_calls(self.text, self.names)
        if not calls:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, []
        return self.text[self.sent:self.text.find(CALL_OPEN)], calls
