"""Exceptions speclm raises for bad input. Each message names the problem and the fix."""


class SpeclmError(Exception):
    """Base class: anything the user can fix. The CLI prints it as one line."""


class ModelError(SpeclmError):
    """Unknown model name, missing extra, corrupt/tampered/truncated model file."""


class TokenizerMismatchError(SpeclmError):
    """Draft and target tokenizers disagree on the ids they share."""


class InvalidRequestError(SpeclmError, ValueError):
    """Empty or over-long prompt, invalid sampling or speculation parameters."""


class BackendError(SpeclmError):
    """The inference backend failed (e.g. a llama.cpp decode returned an error)."""


class BusyError(SpeclmError):
    """What the request needs now (a queue place, a free KV sequence) is all taken:
    retry later (the server's 429, with Retry-After)."""
