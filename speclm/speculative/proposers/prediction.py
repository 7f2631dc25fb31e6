"""Predicted Outputs: the client's expected output as a draft source.

An editor applying an edit knows most of the file it will get back; OpenAI's
`prediction` field sends it. The prediction is followed in order: while the
answer agrees with it, the next draft is the prediction's next tokens; when the
answer leaves it (an inserted, deleted or changed line), drafting resumes at the
prediction's place whose preceding tokens match the answer's last ones (the
longest such match, the first at or after the place it left; else the last one
before it). A short substitution comes first: where the answer's text since it
left is as long, in bytes, as the prediction's next few tokens (a typo fixed,
a number or a name changed), drafting resumes right after those tokens, since
a one-token match of a common word would jump to its next occurrence. Until
the answer reaches the prediction (a code fence or a sentence before the
file), its start is the draft, and only a match of two tokens or more moves it. A prediction only ever drafts: the target verifies every token, so
it can change speed, never the output (docs/methods.md#predicted-outputs).

Each drafted token carries an estimate of its acceptance from the run of answer
tokens that agreed with the prediction up to it, (run + PRIOR) / (run + PRIOR + 1),
and the draft names its source "prediction", so a goodput controller calibrates
these drafts in cells of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .suffix_index import Match

PRIOR = 1  # Laplace's rule: a fresh alignment's first token 0.5 (a prior of 4 verified 15-token drafts
# after one-token realignments that the answer then left at once)
REALIGN_MAX = 16  # the longest tail of the answer matched against the prediction to realign
SUBSTITUTION_MAX = 32  # bytes of answer text since it left the prediction that may replace as many


class Prediction:
    """The alignment of one request's answer with its prediction."""

    source = "prediction"

    def __init__(self, tokens: list[int], piece: Callable[[int], bytes] | None = None):
        """piece(id): the bytes a token decodes to (None: no substitution rule)."""
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.piece = piece
        self.pos: int | None = 0  # the prediction's next expected token (None: the answer left it)
        self.run = 0  # answer tokens in a row that agreed with the prediction, up to pos
        self.left_at = 0  # where the answer last left the prediction
        self.left_answer = 0  # the answer's first token after it left
        self.seen = 0  # answer tokens followed so far

    def __len__(self) -> int:
        return int(self.tokens.size)

    def follow(self, answer: list[int]) -> None:
        """Read the answer's new tokens; realign once it has left the prediction."""
        for i in range(self.seen, len(answer)):
            if self.pos is not None and self.pos < self.tokens.size and self.tokens[self.pos] == answer[i]:
                self.pos += 1
                self.run += 1
            elif self.pos is not None:
                self.left_at, self.left_answer, self.pos, self.run = self.pos, i, None, 0
        self.seen = len(answer)
        if self.pos is None and self.left_at > 0:
            self._substitute(answer[self.left_answer:])
        if self.pos is None and answer:
            self._realign(answer[-REALIGN_MAX:], least=2 if self.left_at == 0 else 1)
        if self.pos is None and self.left_at == 0:  # not reached yet (a code fence, a greeting first)
            self.pos = 0

    def _substitute(self, since: list[int]) -> None:
        """pos := left_at + n where the prediction's n tokens from left_at are exactly as many
        bytes as the answer's tokens since it left (at most SUBSTITUTION_MAX); unchanged if none."""
        if self.piece is None:
            return
        need = sum(len(self.piece(t)) for t in since)
        if need > SUBSTITUTION_MAX:
            return
        size, end = 0, self.left_at
        while size < need and end < self.tokens.size:
            size += len(self.piece(int(self.tokens[end])))
            end += 1
        if size == need and end > self.left_at:
            self.pos, self.run = end, 1

    def _realign(self, tail: list[int], least: int) -> None:
        """pos := the end of the longest match, at least `least` tokens, of the answer's
        tail in the prediction (the first at or after left_at, else the last before it);
        unchanged if none."""
        ends = np.flatnonzero(self.tokens == tail[-1]) + 1  # prediction[end - 1] == the answer's last token
        depth = 1
        while ends.size and depth < len(tail):
            starts = ends - depth - 1
            longer = ends[(starts >= 0) & (self.tokens[np.maximum(starts, 0)] == tail[-depth - 1])]
            if not longer.size:
                break
            ends, depth = longer, depth + 1
        if not ends.size or depth < least:
            return
        after = ends[ends >= self.left_at]
        self.pos = int(after[0] if after.size else ends[-1])
        self.run = depth

    def draft(self, k: int) -> Match:
        """Up to k tokens from the aligned place, with their estimates (length: the run
        the first estimate rests on)."""
        if self.pos is None or k <= 0:
            return Match()
        tokens = tuple(int(t) for t in self.tokens[self.pos:self.pos + k])
        conf = tuple((self.run + j + PRIOR) / (self.run + j + PRIOR + 1) for j in range(len(tokens)))
        return Match(self.run, tokens, conf, (0,) * len(tokens))

