"""Draft-model proposer: a smaller model with its own KV cache, sampled with
the request's own processing; q is exactly what each token was drawn from.
A seeded request draws each token with its position's keyed noise, the noise
the target's own sample there uses (sampling.draw), so the two tend to agree."""

from __future__ import annotations

import numpy as np

from ...backends.base import Backend
from ...sampling import SamplingParams, draw, softmax, target_probs
from .base import Draft, Proposer


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def confidence_stop(logits: np.ndarray, p_min: float, i: int) -> bool:
    """Whether a draft stops before its token i (0-based), drafted from `logits`: the
    draft's top-1 probability there falls below p_min (never before the first token; 0: never).
    Only the draft's length changes: every token drafted keeps its exact q."""
    return p_min > 0.0 and i > 0 and float(softmax(logits).max()) < p_min


class DraftModelProposer(Proposer):
    """Drafts autoregressively with `backend`; rolls its KV back to the longest
    prefix it shares with the new context (O(1)), then feeds the rest."""

    def __init__(self, backend: Backend, p_min: float = 0.0):
        self.backend = backend
        self.p_min = p_min  # stop drafting once the draft's top-1 probability falls below this
        self.name = f"draft:{backend.name}"
        self._seq: int | None = None
        self._held: list[int] = []  # tokens in the draft's KV
        self._last_logits: np.ndarray | None = None  # logits after _held

    def _sync(self, context: list[int]) -> np.ndarray:
        """Make the KV hold `context` exactly; return the logits after it."""
        if self._seq is None:
            self._seq = self.backend.new_sequence()
        keep = common_prefix_len(self._held, context)
        if keep == len(context) == len(self._held) and self._last_logits is not None:
            return self._last_logits
        if keep == len(context):  # context is a strict prefix of held: re-score its last token
            keep -= 1
        self.backend.rollback(self._seq, keep)
        logits = self.backend.prefill(self._seq, context[keep:])
        self._held = list(context)
        self._last_logits = logits
        return logits

    def propose(self, context: list[int], k: int, params: SamplingParams,
                rng: np.random.Generator) -> Draft:
        draft = Draft()
        if k <= 0:
            return draft
        logits = self._sync(context)
        for i in range(k):
            if confidence_stop(logits, self.p_min, i):
                break
            q = target_probs(logits, params)
            tok = int(np.argmax(q)) if params.greedy else draw(q, params, rng, len(context) + i)
            draft.tokens.append(tok)
            draft.q.append(None if params.greedy else q)
            if i + 1 < k:  # the last drafted token is never fed: saves a forward
                logits = self.backend.prefill(self._seq, [tok])
                self._held.append(tok)
                self._last_logits = logits
        return draft

    def close(self) -> None:
        if self._seq is not None:
            self.backend.free(self._seq)
            self._seq = None
            self._held = []
            self._last_logits = None
