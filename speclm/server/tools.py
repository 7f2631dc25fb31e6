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
Calls are read back as JSON objects (parse_calls), streamed as they are written (CallStream).
"""

from __future__ import annotations

import json
import re
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


@dataclass
class ParsedCall:
    name: str
    arguments: str  # the arguments object's JSON text as the model wrote it
    id: str

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_TAIL = re.compile(r"\s*\}\s*")
_SPACE = re.compile(r"\s*")


@dataclass
class _Scan:
    """What the text from the first CALL_OPEN on holds so far: the calls begun, each
    (name, arguments text so far, closed), and whether the text is calls and nothing else."""

    calls: list[tuple[str, str, bool]]
    complete: bool = False  # every call begun was closed by CALL_CLOSE, only whitespace after


def _object_end(text: str, at: int) -> int | None:
    """The index after the JSON object starting at text[at] ('{'), None while unclosed."""
    depth, in_string, escaped = 0, False, False
    for i in range(at, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _scan(text: str, at: int) -> _Scan:
    """Scan the calls written from text[at] (a CALL_OPEN) on: each is CALL_OPEN, the object
    {"name": NAME, "arguments": {...}} and CALL_CLOSE, whitespace between and after."""
    out = _Scan([])
    while True:
        at = _SPACE.match(text, at).end()
        if at == len(text) or CALL_OPEN.startswith(text[at:]) and not text.startswith(CALL_OPEN, at):
            out.complete = at == len(text) and bool(out.calls)
            return out
        if not text.startswith(CALL_OPEN, at):
            return out
        head = _HEAD.match(text, at + len(CALL_OPEN))
        if head is None or not text.startswith("{", head.end()):
            return out  # not yet (streamed), or not a call
        try:
            name = json.loads(f'"{head.group(1)}"')
        except json.JSONDecodeError:
            return out
        end = _object_end(text, head.end())
        out.calls.append((name, text[head.end():end or len(text)], end is not None))
        tail = _TAIL.match(text, end) if end is not None else None
        if tail is None or not text.startswith(CALL_CLOSE, tail.end()):
            return out
        at = tail.end() + len(CALL_CLOSE)


def parse_calls(text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of an answer: the text before the first CALL_OPEN is content; each
    CALL_OPEN {"name": a declared function, "arguments": an object} CALL_CLOSE after it is a
    call (an argument may hold the text of CALL_CLOSE: objects are read as JSON, not
    searched). An answer whose calls do not all parse stays content, whole."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return text, []
    scan = _scan(text, start)
    if not scan.complete or not _named(scan, names):
        return text, []
    content = text[:start]
    return (content if content.strip() else None), [ParsedCall(n, a, _call_id()) for n, a, _ in scan.calls]


def _named(scan: _Scan, names: set[str]) -> bool:
    """Every call names a declared function and its arguments are a JSON object."""
    for name, arguments, _ in scan.calls:
        try:
            ok = name in names and isinstance(json.loads(arguments), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            return False
    return True


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallStream:
    """Splits a streamed answer: text before CALL_OPEN streams as content; from CALL_OPEN
    on, each call streams as OpenAI's tool_calls deltas as the model writes it: first its
    index, id and name (once the name is whole), then its arguments text piece by piece.
    Text that stops being calls before any call was sent goes out as content at the end."""

    def __init__(self, names: set[str]):
        self.names, self.text, self.sent = names, "", 0
        self.start: int | None = None  # where the first CALL_OPEN sits
        self.ids: list[str] = []  # the calls whose head was sent
        self.args_sent: list[int] = []  # how much of each call's arguments was sent

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """(content that can be sent now, tool_calls deltas); a possible start of CALL_OPEN
        is held back."""
        self.text += delta
        if self.start is None:
            cut = self.text.find(CALL_OPEN)
            if cut >= 0:
                self.start = cut
            else:
                cut = len(self.text)
                for k in range(len(CALL_OPEN) - 1, 0, -1):  # the text may end with a prefix of the tag
                    if self.text.endswith(CALL_OPEN[:k]):
                        cut -= k
                        break
            out, self.sent = self.text[self.sent:max(cut, self.sent)], max(cut, self.sent)
            return out, self._deltas() if self.start is not None else []
        return "", self._deltas()

    def _deltas(self) -> list[dict]:
        scan = _scan(self.text, self.start)
        out = []
        for i, (name, arguments, _) in enumerate(scan.calls):
            if name not in self.names:
                break
            if i == len(self.ids):
                self.ids.append(_call_id())
                self.args_sent.append(0)
                out.append({"index": i, "id": self.ids[i], "type": "function",
                            "function": {"name": name, "arguments": ""}})
            if len(arguments) > self.args_sent[i]:
                out.append({"index": i, "function": {"arguments": arguments[self.args_sent[i]:]}})
                self.args_sent[i] = len(arguments)
        return out

    def finish(self) -> tuple[str, list[dict], list[ParsedCall]]:
        """(content not yet sent, the last tool_calls deltas, the calls): text that never
        became a call is content."""
        if self.start is None:
            out, self.sent = self.text[self.sent:], len(self.text)
            return out, [], []
        deltas = self._deltas()
        content, calls = parse_calls(self.text, self.names)
        if calls:
            return "", deltas, [ParsedCall(c.name, c.arguments, i) for c, i in zip(calls, self.ids)]
        if self.ids:  # calls were sent and the answer broke off (max_tokens): what was sent stands
            return "", deltas, []
        out, self.sent = self.text[self.sent:], len(self.text)
        return out, [], []
