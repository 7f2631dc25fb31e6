"""An exact toy backend: a small-vocabulary model whose next-token logits are a
known function of the last `order` tokens.

It exists for statistical losslessness tests: the exact distribution of any
generated continuation can be enumerated, and a block forward is bit-identical
to single-token forwards (batch-invariant by construction). Never a default.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import BackendError
from .base import Backend

TOY_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


class ToyBackend(Backend):
    """Logits(context) = a seeded pseudo-random table row for context[-order:].

    `sharpness` scales the logits: large values make a peaked model, small a
    flat one. Two ToyBackends with different seeds are deliberately unlike.
    Token i is the character TOY_ALPHABET[i]; `eos_id` (optional) ends text.
    """

    def __init__(self, vocab_size: int = 6, seed: int = 0, order: int = 2,
                 sharpness: float = 1.5, eos_id: int | None = None, n_ctx: int = 512,
                 alphabet: str = TOY_ALPHABET, name: str | None = None, max_sequences: int | None = None):
        if not 2 <= vocab_size <= len(alphabet):
            raise ValueError(f"vocab_size must be in [2, {len(alphabet)}]")
        self.vocab_size, self.seed, self.order, self.sharpness = vocab_size, seed, order, sharpness
        self.alphabet = alphabet[:vocab_size]
        self.n_ctx, self.max_sequences = n_ctx, max_sequences  # max_sequences None: unlimited
        self.bos_id = None
        self.eos_ids = frozenset() if eos_id is None else frozenset({eos_id})
        self.name = name or f"toy(v={vocab_size},seed={seed},order={order})"
        self._seqs: dict[int, list[int]] = {}
        self._next_id = 0
        self._memo: dict[tuple[int, ...], np.ndarray] = {}  # logits per context key (pure function)
        self.forward_calls = 0  # how many block forwards ran (for tests)
        self.scored_tokens = 0  # rows scored over all forwards (for tests: what prefill skipped)

    # ---- the model -----------------------------------------------------
    def logits_for(self, context: list[int] | tuple[int, ...]) -> np.ndarray:
        """Exact next-token logits after `context` (float32)."""
        key = tuple(context[-self.order:]) if self.order else ()
        if key not in self._memo:
            self._memo[key] = self._logits(key)
        return self._memo[key].copy()

    def _logits(self, key: tuple[int, ...]) -> np.ndarray:
        digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return (rng.standard_normal(self.vocab_size) * self.sharpness).astype(np.float32)

    # ---- tokenizer -----------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        try:
            return [self.alphabet.index(ch) for ch in text]
        except ValueError:
            bad = next(ch for ch in text if ch not in self.alphabet)
            raise ValueError(f"toy tokenizer: {bad!r} is not in alphabet {self.alphabet!r}") from None

    def token_bytes(self, token: int) -> bytes:
        return self.alphabet[token].encode()

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return "".join(m["content"] for m in messages)

    # ---- sequences -----------------------------------------------------
    def new_sequence(self) -> int:
        if self.max_sequences is not None and len(self._seqs) >= self.max_sequences:
            raise BackendError(f"all {len(self._seqs)} KV sequences of {self.name} are in use")
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = []
        return sid

    def score(self, seq: int, tokens: list[int]) -> np.ndarray:
        held = self._seqs[seq]
        if len(held) + len(tokens) > self.n_ctx:
            raise ValueError("toy backend: context overflow")
        self.forward_calls += 1
        self.scored_tokens += len(tokens)
        rows, hidden = [], []
        for t in tokens:
            held.append(int(t))
            rows.append(self.logits_for(held))
            if self._hidden_rows is not None:
                hidden.append(self.hidden_for(held))
        if hidden:
            self._keep_hidden(seq, len(held) - len(tokens), np.stack(hidden))
        return np.stack(rows)

    # ---- hidden states: one-hot features of the last `order` tokens ------
    def enable_hidden(self) -> int:
        if self._hidden_rows is None:
            self._hidden_rows = {}
        return self.hidden_size

    @property
    def hidden_size(self) -> int:
        return self.vocab_size * max(self.order, 1)

    def hidden_for(self, context: list[int]) -> np.ndarray:
        """The toy's "hidden state" after context: one-hot of each of the last `order` tokens."""
        h = np.zeros(self.hidden_size, np.float32)
        for slot, tok in enumerate(reversed(context[-max(self.order, 1):])):
            h[slot * self.vocab_size + tok] = 1.0
        return h

    def rollback(self, seq: int, n_tokens: int) -> None:
        del self._seqs[seq][n_tokens:]

    def fork(self, seq: int) -> int:
        sid = self.new_sequence()
        self._seqs[sid] = list(self._seqs[seq])
        return sid

    def free(self, seq: int) -> None:
        self._seqs.pop(seq, None)
        if self._hidden_rows is not None:
            self._hidden_rows.pop(seq, None)

    can_copy_kv = True  # the toy's "KV" is its token list

    def save_sequence(self, seq: int) -> tuple[object, int]:
        return tuple(self._seqs[seq]), 4 * len(self._seqs[seq])

    def load_sequence(self, seq: int, state: object, tokens: list[int]) -> None:
        assert not self._seqs[seq] and list(state) == list(tokens)
        self._seqs[seq] = list(state)

    def tokens(self, seq: int) -> list[int]:
        return list(self._seqs[seq])

    @property
    def live_sequences(self) -> int:
        return len(self._seqs)
