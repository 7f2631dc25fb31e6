"""Tool calls written as plain JSON text (docs/server.md#calls-written-as-json-text).

Under tool_choice "auto" a model may answer a call in prose's clothing instead of its
call format: Qwen2.5-Coder-1.5B writes a fenced block, ```json {"name": ..., "arguments":
{...}} ```, where `<tool_call>` was meant. Like llama.cpp's server (its Hermes-2-Pro
parser, which accepts an optional fence before the call object) speclm reads such an
answer as calls, by this rule:

- the calls are the final part of the answer: from the start of a line to the end, only
  blocks (whitespace between and around them), and at least one;
- a block is a value, or a fence (``` or ```json, any case, then a line break) holding
  one or more values and, optionally (the answer may end first), its closing ```;
- a value is a JSON object {"name": NAME, "arguments": {...}} ("parameters" is read as
  "arguments"; no other key), "name" its first key, or a JSON array of such objects;
- NAME is a declared function and the arguments validate against its `parameters`
  (jsonschema), as the grammar guarantees for calls in the call format.

Anything else (another language's fence, an undeclared name, text after the block,
arguments that do not validate) stays content exactly as written. Streamed
(TextCallStream), text from a line start that may still become calls is held back until
it cannot (then it is content) or the answer ends (then it is calls, or content).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import jsonschema

from ..grammar_bounds import json_value_end
from .call_reading import LITERAL, CallStream, ParsedCall, Tags, call_id, parse_calls

FENCE = "```"
_LANGS = ("", "json")  # fence languages a block may name (case-insensitive)
_WS = " \t\r\n"


@dataclass(frozen=True)
class CallSpec:
    """The functions an answer may call (their `parameters` schemas, None: any object),
    and whether calls written as JSON text count (tool_choice "auto")."""

    schemas: dict[str, dict[str, Any] | None]
    text_form: bool = False
    tags: Tags = LITERAL  # how the call format's tags appear in the answer's text (call_reading.py)

    @property
    def names(self) -> set[str]:
        return set(self.schemas)


class Fit(Enum):
    NO = 0  # cannot become calls
    PREFIX = 1  # may still become calls, as more text comes
    FULL = 2  # blocks to the end, as the rule writes them


@dataclass
class _Blocks:
    fit: Fit
    values: list[tuple[int, int]] = field(default_factory=list)  # each closed value's (start, end)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WS:
        at += 1
    return at


def _head(text: str, at: int, names: set[str]) -> Fit:
    """Whether text[at:] opens a call object: `{`, then `"name"` as its first key, then a
    declared name (PREFIX: the text ends before that is settled)."""
    steps: list[str | None] = ["{", None, '"name"', None, ":", None, '"']
    for step in steps:
        if step is None:
            at = _skip(text, at)
            continue
        part = text[at:at + len(step)]
        if part != step[:len(part)]:
            return Fit.NO
        if len(part) < len(step):
            return Fit.PREFIX
        at += len(step)
    close = text.find('"', at)
    name = text[at:] if close < 0 else text[at:close]
    if close < 0:
        return Fit.PREFIX if any(n.startswith(name) for n in names) else Fit.NO
    return Fit.FULL if name in names else Fit.NO


def _value(text: str, at: int, names: set[str]) -> tuple[Fit, int]:
    """A value at text[at] ('{' or '['): (its fit, the index after it when closed)."""
    head_at = at
    if text[at] == "[":
        head_at = _skip(text, at + 1)
        if head_at == len(text):
            return Fit.PREFIX, at
    head = _head(text, head_at, names)
    if head is Fit.NO:
        return Fit.NO, at
    end = json_value_end(text, at)
    if end is None:
        return Fit.PREFIX, at
    return (Fit.FULL, end) if head is Fit.FULL else (Fit.NO, at)


def _fence_open(text: str, at: int) -> tuple[Fit, int]:
    """An opening fence at text[at:]: ``` , a language of _LANGS, a line break."""
    part = text[at:at + 3]
    if part != FENCE[:len(part)]:
        return Fit.NO, at
    if len(part) < 3:
        return Fit.PREFIX, at
    end = at + 3
    while end < len(text) and text[end] not in _WS:
        end += 1
    lang = text[at + 3:end].lower()
    if end == len(text):
        return (Fit.PREFIX if any(ok.startswith(lang) for ok in _LANGS) else Fit.NO), at
    line = text.find("\n", end)
    if lang not in _LANGS or text[end:len(text) if line < 0 else line].strip(" \t\r"):
        return Fit.NO, at
    return (Fit.PREFIX, at) if line < 0 else (Fit.FULL, line + 1)


def scan_blocks(text: str, at: int, names: set[str]) -> _Blocks:
    """How text[at:] fits the rule's blocks (module docstring): the calls' values if FULL."""
    values: list[tuple[int, int]] = []
    while True:
        at = _skip(text, at)
        if at == len(text):
            return _Blocks(Fit.FULL if values else Fit.PREFIX, values)
        fenced = text[at] == "`"
        if fenced:
            fit, at = _fence_open(text, at)
            if fit is not Fit.FULL:
                return _Blocks(fit)
        held = len(values)
        while True:  # the values of one block: one unfenced, any number fenced
            at = _skip(text, at) if fenced else at
            if at == len(text):  # a fence the answer ends in (its closing ``` optional)
                return _Blocks(Fit.FULL if len(values) > held else Fit.PREFIX, values)
            if text[at] not in "{[":
                break
            fit, end = _value(text, at, names)
            if fit is not Fit.FULL:
                return _Blocks(fit)
            values.append((at, end))
            at = end
            if not fenced:
                break
        if len(values) == held:
            return _Blocks(Fit.NO)
        if fenced:
            part = text[at:at + 3]
            if part != FENCE[:len(part)]:
                return _Blocks(Fit.NO)
            if len(part) < 3:
                return _Blocks(Fit.PREFIX)
            at += 3
        if at < len(text) and text[at] not in _WS:
            return _Blocks(Fit.NO)


def _line_starts(text: str, at: int):
    """Where lines start in text, from index `at` on (at itself when it starts one)."""
    if at == 0 or text[at - 1] == "\n":
        yield at
    while (at := text.find("\n", at)) >= 0:
        at += 1
        yield at


def _calls_of(text: str, values: list[tuple[int, int]], spec: CallSpec) -> list[ParsedCall] | None:
    """The calls the values spell, None unless every one is a valid call of a declared function."""
    calls = []
    for start, end in values:
        try:
            value = json.loads(text[start:end])
        except json.JSONDecodeError:
            return None
        for item in value if isinstance(value, list) else [value]:
            call = _call_of(item, spec)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def _call_of(item: Any, spec: CallSpec) -> ParsedCall | None:
    if not isinstance(item, dict) or len(item) != 2 or "name" not in item:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    name = item["name"]
    if not isinstance(name, str) or name not in spec.schemas or not isinstance(arguments, dict):
        return None
    schema = spec.schemas[name]
    if schema is not None:
        try:
            jsonschema.validate(arguments, schema)
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False), call_id())


def _find(text: str, spec: CallSpec) -> tuple[int, list[ParsedCall]] | None:
    """(where the calls start, the calls) of an answer the rule reads as calls, else None:
    the earliest line start from which the text is blocks to the end, every value a call."""
    for start in _line_starts(text, 0):
        blocks = scan_blocks(text, start, spec.names)
        if blocks.fit is Fit.FULL:
            calls = _calls_of(text, blocks.values, spec)
            return None if calls is None else (start, calls)
    return None


def parse_text_calls(text: str, spec: CallSpec) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of an answer whose calls may be written as JSON text (the module's
    rule): the content is the text before them (None if only whitespace). An answer the
    rule does not read as calls is (text, []). Each call's arguments are its object
    re-serialized (json.dumps), the same streamed or not."""
    found = _find(text, spec)
    if found is None:
        return text, []
    content = text[:found[0]]
    return (content if content.strip() else None), found[1]


def read_calls(text: str, spec: CallSpec) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole answer: the call format's calls (tools.parse_calls),
    else, where spec.text_form, calls written as JSON text."""
    content, calls = parse_calls(text, spec.names, spec.tags)
    if calls or not spec.text_form:
        return content, calls
    return parse_text_calls(spec.tags.shown(text), spec)


class TextCallStream:
    """A streamed answer's content and tool_calls deltas: the call format's as CallStream
    sends them; with spec.text_form, content that may still become calls written as JSON
    text is held back, and sent at the end as calls (their deltas whole) or as content."""

    def __init__(self, spec: CallSpec):
        self.spec, self.tagged = spec, CallStream(spec.names, spec.tags)
        self.text, self.sent = "", 0  # the content the call format let through; how much of it went out

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """(content that can be sent now, tool_calls deltas)."""
        content, deltas = self.tagged.feed(delta)
        if not self.spec.text_form:
            return content, deltas
        self.text += content
        cut = len(self.text) if self.tagged.start is not None else self._held()
        out, self.sent = self.text[self.sent:cut], max(cut, self.sent)
        return out, deltas

    def _held(self) -> int:
        """Where the earliest text that may still become calls starts (len: none)."""
        for start in _line_starts(self.text, self.sent):
            if start >= self.sent and scan_blocks(self.text, start, self.spec.names).fit is not Fit.NO:
                return start
        return len(self.text)

    def finish(self) -> tuple[str, list[dict], list[ParsedCall]]:
        """(content not yet sent, the last tool_calls deltas, the calls)."""
        rest, deltas, calls = self.tagged.finish()
        if not self.spec.text_form:
            return rest, deltas, calls
        whole = self.text + rest
        if self.tagged.start is None:
            found = _find(whole, self.spec)
            if found is not None:
                start, calls = found
                deltas = [{"index": i, "id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
                out, self.sent = whole[self.sent:start], len(whole)
                return out, deltas, calls
        out, self.sent = whole[self.sent:], len(whole)
        return out, deltas, calls
