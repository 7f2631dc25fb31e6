"""Tool calls read back from an answer (docs/server.md#tool-calls): each call is the
call-open tag, the object {"name": NAME, "arguments": {...}} and the call-close tag.

Where the vocabulary holds the tags as single tokens (Qwen2.5's `<tool_call>`,
`</tool_call>`), a tag is a tag only where the model emitted that token: the engine
renders the two tokens as the reserved characters U+FDD0 and U+FDD1 in the request's
text (SamplingParams.shown_as) and the parser looks for those, so content that spells
"<tool_call>" in ordinary tokens stays content. Elsewhere (the generic format,
generic_tools.py) the tags are their text. Arguments are read as JSON objects, never
searched for a tag: an argument may hold the text "</tool_call>". Whatever reaches the
client as content has its tags spelled again (Tags.shown).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..grammar_bounds import json_value_end
from .tools import CALL_CLOSE, CALL_OPEN


@dataclass(frozen=True)
class Tags:
    """How the call tags appear in an answer's text, and what they read as to a client."""

    open: str
    close: str

    def shown(self, text: str) -> str:
        """text with the tags spelled as the client reads them."""
        if self is LITERAL:
            return text
        return text.replace(self.open, CALL_OPEN).replace(self.close, CALL_CLOSE)


LITERAL = Tags(CALL_OPEN, CALL_CLOSE)  # the tags are their text (the generic format)
BY_TOKEN = Tags("\ufdd0", "\ufdd1")  # the tags are the tokens the engine rendered as these


def token_tags(tokenize) -> tuple[Tags, tuple[tuple[int, str], ...]]:
    """(the tags, SamplingParams.shown_as) for a vocabulary: BY_TOKEN with each tag token's
    rendering where `tokenize(text)` (control tokens allowed) spells both tags as one token
    each, else LITERAL and nothing rendered."""
    ids = [tokenize(tag) for tag in (CALL_OPEN, CALL_CLOSE)]
    if all(len(i) == 1 for i in ids) and ids[0] != ids[1]:
        return BY_TOKEN, ((ids[0][0], BY_TOKEN.open), (ids[1][0], BY_TOKEN.close))
    return LITERAL, ()


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
    """What the text from the first call-open tag on holds so far: the calls begun, each
    (name, arguments text so far, closed), and whether the text is calls and nothing else."""

    calls: list[tuple[str, str, bool]]
    complete: bool = False  # every call begun was closed by its tag, only whitespace after


def _scan(text: str, at: int, tags: Tags) -> _Scan:
    """Scan the calls written from text[at] (a call-open tag) on: each is the open tag, the
    object {"name": NAME, "arguments": {...}} and the close tag, whitespace between and after."""
    out = _Scan([])
    while True:
        at = _SPACE.match(text, at).end()
        if at == len(text) or tags.open.startswith(text[at:]) and not text.startswith(tags.open, at):
            out.complete = at == len(text) and bool(out.calls)
            return out
        if not text.startswith(tags.open, at):
            return out
        head = _HEAD.match(text, at + len(tags.open))
        if head is None or not text.startswith("{", head.end()):
            return out  # not yet (streamed), or not a call
        try:
            name = json.loads(f'"{head.group(1)}"')
        except json.JSONDecodeError:
            return out
        end = json_value_end(text, head.end())
        out.calls.append((name, text[head.end():end or len(text)], end is not None))
        tail = _TAIL.match(text, end) if end is not None else None
        if tail is None or not text.startswith(tags.close, tail.end()):
            return out
        at = tail.end() + len(tags.close)


def parse_calls(text: str, names: set[str], tags: Tags = LITERAL) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of an answer: the text before the first call-open tag is content;
    each open tag, {"name": a declared function, "arguments": an object}, close tag after it
    is a call. An answer whose calls do not all parse stays content, whole (its tags shown)."""
    start = text.find(tags.open)
    if start < 0:
        return tags.shown(text), []
    scan = _scan(text, start, tags)
    if not scan.complete or not _named(scan, names):
        return tags.shown(text), []
    content = tags.shown(text[:start])
    return (content if content.strip() else None), [ParsedCall(n, a, call_id()) for n, a, _ in scan.calls]


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


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallStream:
    """Splits a streamed answer: text before the call-open tag streams as content; from the
    tag on, each call streams as OpenAI's tool_calls deltas as the model writes it: first its
    index, id and name (once the name is whole), then its arguments text piece by piece.
    Text that stops being calls before any call was sent goes out as content at the end."""

    def __init__(self, names: set[str], tags: Tags = LITERAL):
        self.names, self.tags, self.text, self.sent = names, tags, "", 0
        self.start: int | None = None  # where the first call-open tag sits
        self.ids: list[str] = []  # the calls whose head was sent
        self.args_sent: list[int] = []  # how much of each call's arguments was sent

    def feed(self, delta: str) -> tuple[str, list[dict]]:
        """(content that can be sent now, tool_calls deltas); a possible start of the
        call-open tag is held back."""
        self.text += delta
        if self.start is None:
            opening = self.tags.open
            cut = self.text.find(opening)
            if cut >= 0:
                self.start = cut
            else:
                cut = len(self.text)
                for k in range(len(opening) - 1, 0, -1):  # the text may end with a prefix of the tag
                    if self.text.endswith(opening[:k]):
                        cut -= k
                        break
            out, self.sent = self.text[self.sent:max(cut, self.sent)], max(cut, self.sent)
            return self.tags.shown(out), self._deltas() if self.start is not None else []
        return "", self._deltas()

    def _deltas(self) -> list[dict]:
        scan = _scan(self.text, self.start, self.tags)
        out = []
        for i, (name, arguments, _) in enumerate(scan.calls):
            if name not in self.names:
                break
            if i == len(self.ids):
                self.ids.append(call_id())
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
            return self.tags.shown(out), [], []
        deltas = self._deltas()
        _, calls = parse_calls(self.text, self.names, self.tags)
        if calls:
            return "", deltas, [ParsedCall(c.name, c.arguments, i) for c, i in zip(calls, self.ids)]
        if self.ids:  # calls were sent and the answer broke off (max_tokens): what was sent stands
            return "", deltas, []
        out, self.sent = self.text[self.sent:], len(self.text)
        return self.tags.shown(out), [], []
