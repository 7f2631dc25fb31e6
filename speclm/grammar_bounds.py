"""What llguidance is given, bounded (docs/design.md#structured-outputs): a grammar's text,
its depth (a JSON schema's nesting with its `$ref`s followed, a Lark grammar's chains of rule
and terminal references, each `%json` schema's depth added where it sits) and the product of
nested counted repetitions in its regexes. llguidance compiles recursively in native code, and
a grammar deep enough overflows the thread's stack and ends the process (grammar_safety.py):
over a bound is an InvalidRequestError naming it, before anything is compiled."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidRequestError

MAX_GRAMMAR_CHARS = 256 * 1024  # a grammar's text: the schema's JSON, the regex, the Lark source
MAX_DEPTH = 512  # levels of a schema (containers, $refs followed) or of Lark rule references
MAX_REPEAT = 100_000  # the product of nested counted repetitions in a regex ({n}, {n,m}; Lark's ~ n..m)


class _Over(Exception):
    pass


def check_bounds(kind: str, text: str) -> None:
    """InvalidRequestError when a grammar of `kind` with source `text` is over a bound."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequestError(f"the {kind} grammar is {len(text)} characters long, over speclm's limit of "
                                  f"{MAX_GRAMMAR_CHARS}: shorten it")
    try:
        if kind == "json_schema":
            depth, repeat = _schema_measures(json.loads(text))
        elif kind == "regex":
            depth, repeat = 0, regex_repeat(text)
        else:
            depth, repeat = _lark_measures(text)
    except (_Over, RecursionError):
        depth, repeat = MAX_DEPTH + 1, 0
    if depth > MAX_DEPTH:
        what = "nests deeper (its $refs followed)" if kind == "json_schema" else \
            "chains rule references (and the %json schemas they reach) deeper"
        raise InvalidRequestError(f"the {kind} grammar {what} than speclm's limit of {MAX_DEPTH} levels: flatten it")
    if repeat > MAX_REPEAT:
        raise InvalidRequestError(f"the {kind} grammar repeats a pattern {repeat} times (nested counted "
                                  f"repetitions multiply), over speclm's limit of {MAX_REPEAT}: use smaller counts, "
                                  "or * and + where any number will do")


def _schema_measures(root: Any) -> tuple[int, int]:
    """(depth, repeat) of a JSON schema: its levels of containers with each local $ref
    followed into its target (a ref back into a target being measured is recursion, not
    depth), and the largest repetition of its `pattern`s and `patternProperties`."""
    heights: dict[int, int] = {}
    active: set[int] = set()
    repeat = 0

    def height(node: Any, depth: int) -> int:
        nonlocal repeat
        if depth > MAX_DEPTH:
            raise _Over
        if isinstance(node, list):
            return 1 + max((height(v, depth + 1) for v in node), default=0)
        if not isinstance(node, dict):
            return 0
        best = 0
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                repeat = max(repeat, regex_repeat(value))
            elif key == "patternProperties" and isinstance(value, dict):
                repeat = max([repeat, *(regex_repeat(k) for k in value)])
            if key == "$ref" and isinstance(value, str):
                target = _resolve(root, value)
                if target is None or id(target) in active:
                    continue
                if id(target) not in heights:
                    active.add(id(target))
                    heights[id(target)] = height(target, depth + 1)
                    active.discard(id(target))
                if depth + heights[id(target)] > MAX_DEPTH:
                    raise _Over
                best = max(best, heights[id(target)])
            elif isinstance(value, (dict, list)):
                best = max(best, height(value, depth + 1))
        return 1 + best

    return height(root, 1), repeat


def _resolve(root: Any, ref: str) -> Any:
    """The node a local JSON pointer ("#/$defs/a") names in root; None for any other ref."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _count(match: re.Match) -> int:
    low, high = match.group(1), match.group(2)
    digits = high if high else low
    return int(digits) if len(digits) <= 12 else 10 ** 12


def regex_repeat(pattern: str) -> int:
    """The largest product of nested counted repetitions in a regex: `(a{100}){30}` is 3000,
    `a{5}b{7}` is 7 (`*`, `+` and `?` count 1: they add no states)."""
    groups = [1]  # per open group: the largest repetition inside it so far
    last: int | None = None  # the weight of the atom a quantifier would apply to
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            end = pattern.find("}", i) + 1 if pattern[i + 1:i + 3] in ("p{", "P{", "x{", "u{") else i + 2
            i, last = max(end, i + 2), 1
        elif c == "[":
            i, last = _class_end(pattern, i), 1
        elif c == "(":
            groups.append(1)
            i += 1
            if pattern[i:i + 1] == "?":  # (?:, (?i), (?P<name>: the prefix is no atom
                while i < n and pattern[i] not in ":)>":
                    i += 1
                i += pattern[i:i + 1] in (":", ">")
            last = None
        elif c == ")":
            inner = groups.pop() if len(groups) > 1 else 1
            groups[-1] = max(groups[-1], inner)
            i, last = i + 1, inner
        elif c == "{" and last is not None and (m := _COUNT.match(pattern, i)):
            last *= _count(m)
            groups[-1] = max(groups[-1], last)
            i = m.end()
        else:
            i, last = i + 1, 1
    return max(groups)


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class starting at pattern[i] == "[" (nested classes,
    escapes, and a leading ] or ^] read as Rust's regex reads them)."""
    j, depth = i + 1, 0
    if pattern[j:j + 1] == "^":
        j += 1
    if pattern[j:j + 1] == "]":
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
            continue
        if pattern[j] == "[":
            depth += 1
        elif pattern[j] == "]":
            if depth == 0:
                return j + 1
            depth -= 1
        j += 1
    return j


_LARK = re.compile(r"""
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<directive>%[A-Za-z_]+)
  | (?P<special><[^<>\s]*>)
  | (?P<name>[_A-Za-z][_A-Za-z0-9]*)
  | (?P<count>\{\s*\d+\s*(?:,\s*\d*\s*)?\})
  | (?P<tilde>~\s*\d+(?:\s*\.\.\s*\d+)?)
  | (?P<open>[(\[])
  | (?P<close>[)\]])
  | (?P<newline>\n)
  | (?P<other>.)
""", re.X | re.S)
_DEFINES = re.compile(r"\s*(?:\.\s*-?\d+\s*)?:")


def _lark_measures(text: str) -> tuple[int, int]:
    """(depth, repeat) of a Lark grammar (llguidance's dialect): the longest chain of rule
    and terminal references from any definition (cycles cut), each %json schema's depth
    added where it sits; the largest product of nested repetitions, across references."""
    atoms: dict[str, list[tuple[int, str | int]]] = {}  # definition -> (multiplier, name or weight)
    refs: dict[str, set[str]] = {}
    extra: dict[str, int] = {}  # definition -> the deepest %json schema it embeds
    current, line_start = "", True
    stack: list[list[tuple[int, str | int]]] = [[]]
    last: list[tuple[int, str | int]] = []
    pos = 0
    while pos < len(text):
        m = _LARK.match(text, pos)
        kind, token, pos = m.lastgroup, m.group(), m.end()
        if kind == "other" and token in " \t\r?!":
            continue
        if kind == "newline":
            line_start = True
            continue
        if kind == "name" and line_start and (d := _DEFINES.match(text, pos)):
            current, pos = token, d.end()
            atoms.setdefault(current, [])
            refs.setdefault(current, set())
            stack, last, line_start = [atoms[current]], [], False
            continue
        line_start = False
        if kind in ("comment",):
            continue
        if kind == "directive":
            brace = re.compile(r"\s*\{").match(text, pos)
            if brace is None:
                continue
            end = json_value_end(text, brace.end() - 1) or len(text)
            if token == "%json":
                try:
                    depth, repeat = _schema_measures(json.loads(text[brace.end() - 1:end]))
                except ValueError:  # not JSON: llguidance's compile says so
                    depth, repeat = 0, 1
                extra[current] = max(extra.get(current, 0), depth)
                last = [(1, repeat)]
                stack[-1].extend(last)
            pos = end
        elif kind in ("string", "special", "regex", "name"):
            atom: tuple[int, str | int] = (1, regex_repeat(token[1:token.rindex("/")]) if kind == "regex" else 1)
            if kind == "name":
                atom = (1, token)
                refs.setdefault(current, set()).add(token)
            last = [atom]
            stack[-1].append(atom)
        elif kind == "open":
            stack.append([])
            last = []
        elif kind == "close" and len(stack) > 1:
            last = stack.pop()
            stack[-1].extend(last)
        elif kind in ("count", "tilde") and last:
            digits = re.findall(r"\d+", token)
            times = max(int(d) if len(d) <= 12 else 10 ** 12 for d in digits)
            scaled = [(mult * times, what) for mult, what in last]
            del stack[-1][len(stack[-1]) - len(last):]
            stack[-1].extend(scaled)
            last = scaled
        else:
            last = []

    depths: dict[str, int] = {}
    weights: dict[str, int] = {}
    active: set[str] = set()

    def measure(name: str, depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:
            raise _Over
        if name in depths:
            return depths[name], weights[name]
        active.add(name)
        deepest, weight = extra.get(name, 0), 1
        for mult, what in atoms.get(name, []):
            if isinstance(what, str):
                if what in active or what not in atoms:
                    continue
                below, w = measure(what, depth + 1)
                deepest, weight = max(deepest, below), max(weight, mult * w)
            else:
                weight = max(weight, mult * what)
        active.discard(name)
        depths[name], weights[name] = 1 + deepest, weight
        return depths[name], weights[name]

    found = [measure(name, 1) for name in atoms]
    return max((d for d, _ in found), default=0), max((w for _, w in found), default=1)


def json_value_end(text: str, at: int) -> int | None:
    """The index after the JSON object or array starting at text[at] ("{" or "["), strings
    and their escapes respected; None while it is unclosed."""
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
