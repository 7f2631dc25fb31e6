"""A backend that replays recorded greedy outputs: the target a controller is
evaluated against offline (speclm/speculative/replay.py).

Each request's whole sequence (prompt, then the output plain decoding gave) is
known in advance; a row's logits put all their weight on the recorded next
token, so greedy decoding through the ordinary loop emits exactly the
recording, and a drafted token is accepted exactly when the recording has it
there. The end of a recording is followed by `eos_id`. No model is loaded and
no forward costs anything: what a round would have cost comes from a measured
curve, not from this backend's time.
"""

from __future__ import annotations

import numpy as np

from .base import Backend

PEAK = 30.0  # the recorded token's logit; every other token's is 0


class RecordedBackend(Backend):
    """Replays recordings over a vocabulary of `vocab_size` ids: `expect(prompt, output)`
    names the recording the sequences taken from then on follow (one request at a time)."""

    def __init__(self, vocab_size: int, eos_id: int, n_ctx: int = 1 << 16, name: str = "recorded"):
        self.vocab_size, self.n_ctx, self.name = vocab_size, n_ctx, name
        self.bos_id = None
        self.eos_ids = frozenset({eos_id})
        self._eos = eos_id
        self._expected: list[int] | None = None  # prompt + output of the request being replayed
        self._recording: dict[int, list[int]] = {}  # sequence -> the recording it follows
        self._seqs: dict[int, list[int]] = {}
        self._next_id = 0

    def expect(self, prompt: list[int], output: list[int]) -> None:
        """The next request: its sequence starts with `prompt` and continues with `output`."""
        self._expected = [*prompt, *output]

    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        raise NotImplementedError("a recorded backend replays token ids; it has no tokenizer")

    def token_bytes(self, token: int) -> bytes:
        return b""

    def new_sequence(self) -> int:
        if self._expected is None:
            raise KeyError("no recording to follow: call expect(prompt, output) first")
        sid, self._next_id = self._next_id, self._next_id + 1
        self._seqs[sid], self._recording[sid] = [], self._expected
        return sid

    def score(self, seq: int, tokens: list[int]) -> np.ndarray:
        held = self._seqs[seq]
        held.extend(int(t) for t in tokens)
        full = self._recording[seq]
        rows = np.zeros((len(tokens), self.vocab_size), np.float32)
        for j in range(len(tokens)):
            at = len(held) - len(tokens) + j + 1  # the position row j predicts
            rows[j, full[at] if at < len(full) else self._eos] = PEAK
        return rows

    def rollback(self, seq: int, n_tokens: int) -> None:
        del self._seqs[seq][n_tokens:]

    def fork(self, seq: int) -> int:
        sid = self.new_sequence()
        self._seqs[sid], self._recording[sid] = list(self._seqs[seq]), self._recording[seq]
        return sid

    def free(self, seq: int) -> None:
        self._seqs.pop(seq, None)
        self._recording.pop(seq, None)

    def tokens(self, seq: int) -> list[int]:
        return list(self._seqs[seq])
