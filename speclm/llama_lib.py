"""llama.cpp's shared library through llama-cpp-python's ctypes API: initialised
once, its log captured (errors kept for our own one-line messages, the rest
echoed only with SPECLM_LLAMA_LOG). The backends and the quantizer use it."""

from __future__ import annotations

import ctypes
import os
from collections import deque
from pathlib import Path

from . import native
from .errors import ModelError

try:
    import llama_cpp as L
except ImportError as exc:  # pragma: no cover - install problem
    raise ModelError("llama-cpp-python is not installed: run `pip install speclm`") from exc


recent_errors: deque[str] = deque(maxlen=8)  # llama.cpp's latest error lines


@L.llama_log_callback
def _capture_log(level, text, user_data):
    """Keep llama.cpp's error lines for our own messages; echo its whole log
    only when SPECLM_LLAMA_LOG is set (it is chatty and would break one-line errors)."""
    if level == 4:  # GGML_LOG_LEVEL_ERROR
        recent_errors.append(text.decode("utf-8", "replace").strip())
    if os.environ.get("SPECLM_LLAMA_LOG"):
        os.write(2, text)


def last_error() -> str:
    return next((line for line in reversed(recent_errors) if line), "no reason given")


_initialised = False


def init_once() -> None:
    global _initialised
    if not _initialised:
        L.llama_log_set(_capture_log, ctypes.c_void_p())
        L.llama_backend_init()
        native.register(Path(L.__file__).parent / "lib")  # before any model load; never raises
        _initialised = True
