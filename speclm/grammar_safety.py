"""Grammar compilation that cannot take the process down (docs/design.md#structured-outputs).

llguidance compiles a grammar recursively in native code. A JSON schema whose `$ref`s chain
~1000 definitions deep, or a Lark grammar whose rules do, overflows the thread's stack and
ends the whole process with SIGSEGV (llguidance 1.9.1; there is no exception to catch). So a
grammar reaches llguidance's compiler in this process only after

1. `check_bounds`: what llguidance is given is bounded. The grammar's text (MAX_GRAMMAR_CHARS);
   its depth (MAX_DEPTH): a JSON schema's nesting with its `$ref`s followed, a Lark grammar's
   chains of rule and terminal references (each `%json` schema's depth added where it sits);
   and the product of nested counted repetitions in its regexes (MAX_REPEAT: `(a{1000}){1000}`
   is a million). Over a bound: InvalidRequestError naming it, before anything is compiled.
2. `CompileWorker`: a child process (grammar_worker.py) has compiled it as this process will
   (validate, matcher, first mask) within COMPILE_TIMEOUT_S on a thread with a 16 MB stack. A
   crash or a timeout there costs that grammar an InvalidRequestError (remembered) and the
   worker a restart; this process never compiles it.
3. `on_big_stack`: this process then compiles it on a thread with a COMPILE_STACK_MB stack (4x
   the worker's), so what fitted there fits here with room to spare.

constraints.matcher_for keeps the compiled matcher by the grammar's text (requests take a deep
copy, microseconds), and every error by text too: a grammar seen before costs nothing more,
not even the worker's round trip. Measured costs: docs/server.md#structured-outputs.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import InvalidRequestError

log = logging.getLogger(__name__)

MAX_GRAMMAR_CHARS = 256 * 1024  # a grammar's text: the schema's JSON, the regex, the Lark source
MAX_DEPTH = 512  # levels of a schema (containers, $refs followed) or of Lark rule references
MAX_REPEAT = 100_000  # the product of nested counted repetitions in a regex ({n}, {n,m}; Lark's ~ n..m)
COMPILE_TIMEOUT_S = 5.0  # the worker's compile and first mask of one grammar
WORKER_START_TIMEOUT_S = 60.0  # the worker's start and a vocabulary's tokenizer (~1 s for 150k tokens)
COMPILE_STACK_MB = 64  # this process's compile thread (the worker's: grammar_worker.STACK_MB, 16)
# llguidance's parser limits, the same in the worker and here: its defaults, but errors without
# a dump of the parser's state and the grammar (a client's error message, not a debug trace)
PARSER_LIMITS: dict[str, Any] = {"verbose_errors": False}

T = TypeVar("T")


# ---- 1. bounds ---------------------------------------------------------------------------
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
            end = _json_object_end(text, brace.end() - 1)
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


def _json_object_end(text: str, start: int) -> int:
    """The index after the JSON object starting at text[start] == "{" (strings respected)."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


# ---- 2. the compile worker ---------------------------------------------------------------
class GrammarCrash(Exception):
    """The worker died or ran out of time on a grammar (the message says which; a timeout
    is `transient`: a busy machine may compile the same grammar in time later)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class CompileWorker:
    """The child process every new grammar is compiled in first (grammar_worker.py): one
    at a time, each within COMPILE_TIMEOUT_S. Started on first use, and again after it
    dies (in the background, at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._known: set[str] = set()  # the vocabularies the running worker holds
        self._owner = os.getpid()
        self.starts = 0
        self.unavailable: str | None = None  # why no worker can be started here (then no trial runs)

    def _forked(self) -> None:
        """A process forked from the worker's owner starts its own (the pipes are the owner's)."""
        if self._owner != os.getpid():
            self._lock, self._proc, self._known, self._owner = threading.Lock(), None, set(), os.getpid()

    def check(self, key: str, vocabulary: Callable[[], tuple], source: str) -> str | None:
        """Compile `source` in the worker against vocabulary `key` (vocabulary(): its
        description, grammar_worker._tokenizer's, sent once per worker). None when it
        compiled, llguidance's message when it failed cleanly; GrammarCrash when the
        worker died or ran out of time. None too where no worker can run."""
        self._forked()
        with self._lock:
            if not self._ensure():
                return None
            for _ in range(2):
                if key not in self._known:
                    self._call(("tokenizer", key, vocabulary()), WORKER_START_TIMEOUT_S, "building the tokenizer")
                    self._known.add(key)
                answer = self._call(("check", key, source, PARSER_LIMITS), COMPILE_TIMEOUT_S, "compiling")
                if answer[0] != "unknown":  # "unknown": the worker dropped this vocabulary; send it again
                    return answer[1] if answer[0] == "error" else None
                self._known.discard(key)
            return None

    def prepare(self, key: str, vocabulary: Callable[[], tuple]) -> None:
        """Start the worker and give it vocabulary `key` now (GrammarCrash if it dies)."""
        self._forked()
        with self._lock:
            if self._ensure() and key not in self._known:
                self._call(("tokenizer", key, vocabulary()), WORKER_START_TIMEOUT_S, "building the tokenizer")
                self._known.add(key)

    def _ensure(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        if self.unavailable is not None:
            return False
        self._proc, self._known = None, set()
        try:
            self._proc = subprocess.Popen([sys.executable, "-P", str(Path(__file__).with_name("grammar_worker.py"))],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          bufsize=0, close_fds=True)
            self.starts += 1
            return True
        except (OSError, ValueError) as exc:  # no interpreter to run (embedded Python), no processes allowed
            self.unavailable = f"{type(exc).__name__}: {exc}"
            log.warning("the grammar compile worker cannot start (%s): grammars compile in this process, "
                        "bounded but without the worker's protection", self.unavailable)
            return False

    def _call(self, message: tuple, timeout: float, doing: str) -> tuple:
        proc = self._proc
        data = pickle.dumps(message)
        try:
            proc.stdin.write(struct.pack(">I", len(data)) + data)
            proc.stdin.flush()
            head = self._read(4, time.monotonic() + timeout)
            answer = pickle.loads(self._read(struct.unpack(">I", head)[0], time.monotonic() + timeout))
        except TimeoutError:
            self._lost()
            raise GrammarCrash(f"it took over {timeout:g} s ({doing} it)", transient=True) from None
        except (OSError, EOFError, struct.error, pickle.UnpicklingError):
            code = self._lost()
            raise GrammarCrash("llguidance's compiler crashed on it" + _signal_name(code)) from None
        return answer

    def _read(self, n: int, deadline: float) -> bytes:
        fd, data = self._proc.stdout.fileno(), b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def _lost(self) -> int | None:
        """The worker died or hangs: end it, and start the next one now, in the background."""
        proc, self._proc, self._known = self._proc, None, set()
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        threading.Thread(target=self._restart, name="speclm-grammar-worker-start", daemon=True).start()
        return code

    def _restart(self) -> None:
        with self._lock:
            self._ensure()

    def close(self) -> None:
        if self._owner != os.getpid():  # a forked child's exit leaves its parent's worker be
            return
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return f" (signal {-code})"
    return "" if code is None else f" (exit status {code})"


WORKER = CompileWorker()
atexit.register(WORKER.close)


# ---- 3. this process's compile -----------------------------------------------------------
_STACK_LOCK = threading.Lock()


def on_big_stack(fn: Callable[[], T]) -> T:
    """fn() on a fresh thread with a COMPILE_STACK_MB stack (virtual: only the pages used
    are ever touched); its result, or its exception."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    with _STACK_LOCK:
        old = threading.stack_size(COMPILE_STACK_MB << 20)
        try:
            thread = threading.Thread(target=run, name="speclm-grammar-compile", daemon=True)
            thread.start()
        finally:
            threading.stack_size(old)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
