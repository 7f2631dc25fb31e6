"""Grammar compilation that cannot take the process down (docs/design.md#structured-outputs).

llguidance compiles a grammar recursively in native code. A JSON schema whose `$ref`s chain
~1000 definitions deep, or a Lark grammar whose rules do, overflows the thread's stack and
ends the whole process with SIGSEGV (llguidance 1.9.1; there is no exception to catch). So a
grammar reaches llguidance's compiler in this process only after

1. `check_bounds` (grammar_bounds.py): what llguidance is given is bounded. The grammar's text (MAX_GRAMMAR_CHARS);
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
import logging
import os
import pickle
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


log = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 5.0  # the worker's compile and first mask of one grammar
WORKER_START_TIMEOUT_S = 60.0  # the worker's start and a vocabulary's tokenizer (~1 s for 150k tokens)
COMPILE_STACK_MB = 64  # this process's compile thread (the worker's: grammar_worker.STACK_MB, 16)
# llguidance's parser limits, the same in the worker and here: its defaults, but errors without
# a dump of the parser's state and the grammar (a client's error message, not a debug trace)
PARSER_LIMITS: dict[str, Any] = {"verbose_errors": False}

T = TypeVar("T")


# ---- the compile worker ---------------------------------------------------------------
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
