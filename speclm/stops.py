"""Incremental detokenisation with stop conditions.

Tokens are pushed one at a time in output order. Text is released only when
it is final: incomplete UTF-8 is held back, and so is any tail that could
still grow into a stop string. Once a stop fires, nothing after it is ever
emitted (neither text nor tokens).
"""

from __future__ import annotations

from collections.abc import Callable

from .backends.base import Backend
from .sampling import SamplingParams


class StopChecker:
    def __init__(self, backend: Backend, params: SamplingParams,
                 eos_ids: frozenset[int] | None = None):
        self.backend = backend
        self.params = params
        self.eos_ids = frozenset() if params.ignore_eos else (eos_ids if eos_ids is not None else backend.eos_ids)
        self.token_ids: list[int] = []
        self._bytes = b""
        self._shown = {token: text.encode() for token, text in params.shown_as}
        self._released = 0  # chars of the decoded text already released
        self.finished: str | None = None  # "stop" | "length" | "content_filter"
        self.eos_token: int | None = None  # the end-of-sequence token that finished it (in no text, no token_ids)
        self._holdback = max((len(s) for s in params.stop), default=1) - 1
        self.text = ""

    def push(self, token: int) -> str:
        """Add one token; return newly final text ("" if none). No-op once finished."""
        if self.finished:
            return ""
        if token in self.eos_ids:
            self.eos_token = token
            return self._finish("stop")
        self.token_ids.append(token)
        shown = self._shown.get(token)
        self._bytes += self.backend.token_bytes(token) if shown is None else shown
        self.text = _decode_complete(self._bytes)
        at = self._earliest_stop()
        if at is not None:
            self.text = self.text[:at]
            self.finished = "stop"
            return self._release(final=True)
        if len(self.token_ids) >= self.params.max_new_tokens:
            return self._finish("length")
        return self._release(final=False)

    def _earliest_stop(self) -> int | None:
        """Where the earliest stop-string match starts in the text (None: no match).

        The earliest position wins, not the first string in list order:
        stop=("b", "ab") on "cab" cuts at "c". Only matches that end in the
        not-yet-released tail can be new, so the search starts there.
        """
        hits = [self.text.find(s, max(0, self._released - len(s) + 1)) for s in self.params.stop]
        return min((at for at in hits if at != -1), default=None)

    def finish_filtered(self) -> str:
        """No token is left to emit (the request's logit_bias, grammar and penalties exclude
        the whole vocabulary at the next position): end with finish_reason "content_filter"."""
        return "" if self.finished else self._finish("content_filter")

    def finish_length(self) -> str:
        """The context filled up: release whatever is held."""
        return "" if self.finished else self._finish("length")

    def _finish(self, reason: str) -> str:
        """End without a stop-string cut: the whole byte string is final."""
        self.finished = reason
        self.text = self._bytes.decode("utf-8", errors="replace")
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else max(self._released, len(self.text) - self._holdback)
        out = self.text[self._released:end]
        self._released = end
        return out

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids)


def _decode_complete(data: bytes) -> str:
    """Decode, leaving out a trailing incomplete UTF-8 sequence (max 3 bytes)."""
    for cut in range(0, 4):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


TextCallback = Callable[[str], None]
