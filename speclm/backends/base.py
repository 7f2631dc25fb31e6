"""The small interface every backend implements.

A backend owns one model and a KV memory holding several sequences. A
sequence is an integer id; its KV holds a list of tokens the backend tracks.
The speculative loop only ever calls these methods, so it never knows whether
it drives llama.cpp or the exact toy model.

Contracts:
- `score(seq, tokens)` appends `tokens` to `seq` and returns float32 logits of
  shape (len(tokens), vocab): row i is the next-token logits after tokens[i].
  It is ONE forward pass over the block.
- `prefill(seq, tokens)` is `score` returning only the last row; `score_last(seq,
  tokens, n)` only the last n rows (a backend need not compute the others' logits).
- `score_batch([(seq, tokens), ...], last_rows, skip_rows)` is `score` (or
  `score_last`) for each, possibly in one forward over all sequences (same results
  up to batch numerics); rows in `skip_rows` come back as zeros (not computed).
- `rollback(seq, n)` keeps the first n tokens; O(1) bookkeeping, no recompute.
- `fork(seq)` returns a new sequence sharing seq's tokens (KV copied/shared).
- `save_sequence(seq)` copies seq's KV out of the backend; `load_sequence(seq,
  state, tokens)` puts such a copy into an empty sequence (prefix_cache.py).
- `enable_hidden()` (optional) makes every later forward also keep each row's
  final hidden state (the vector the output head multiplies); `hidden_states(seq)`
  returns those of seq's latest forward that are still in its KV.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InvalidRequestError

N_CTX = 4096  # tokens one sequence holds when the loader is not told otherwise (--n-ctx)
KV_SEQUENCES = 2  # sequences live at once (requests in flight) when the loader is not told otherwise


class Backend(ABC):
    """One model + its tokenizer + a multi-sequence KV memory."""

    name: str  # a human-readable model identity (file path or toy name)
    path: Path | None = None  # the model file it loaded (None: an in-memory model)
    vocab_size: int
    n_ctx: int  # max tokens one sequence can hold
    max_sequences: int | None = None  # sequences that can be live at once (None: unlimited)
    eos_ids: frozenset[int]  # tokens that end generation (EOS, EOT, chat end)
    bos_id: int | None
    kernel_choice = None  # llama.cpp: the probe.KernelChoice it was loaded with (None: no kernels to choose)

    @property
    def live_sequences(self) -> int:
        """Sequences held now (given by new_sequence, not yet freed); 0 where not counted."""
        return 0

    # ---- tokenizer -------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        """Token ids of text; add_special: prepend BOS (if the model has one);
        special: text like "<|im_end|>" becomes that control token (False: plain text)."""

    @abstractmethod
    def token_bytes(self, token: int) -> bytes:
        """The raw bytes a token decodes to (may be part of a UTF-8 char)."""

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The model's own chat template text (None: it has none)."""
        return None

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Render chat messages (and the tools offered) into a prompt string with the model's template."""
        raise NotImplementedError(f"{self.name} has no chat template")

    def holds_control_text(self, text: str) -> bool:
        """Whether text spells a control token (e.g. "<|im_end|>") that would become one in markup."""
        return self.tokenize(text, add_special=False, special=True) != \
            self.tokenize(text, add_special=False, special=False)

    def tokenize_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Chat messages as prompt ids: the template's own markup may hold control
        tokens, the messages' contents never do (they are plain text), so no
        message can forge a turn ("<|im_start|>system..." stays text). Tools and
        tool calls are rendered into the markup: the caller refuses any that hold
        control text (holds_control_text)."""
        # an empty content stays empty: templates test it (an assistant turn holding only tool calls)
        marks = [f"\ue000{i}\ue001" if m["content"] else "" for i, m in enumerate(messages)]
        skeleton = self.apply_chat_template([{**m, "content": mk} for m, mk in zip(messages, marks)], tools)
        parts = re.split("\ue000(\\d+)\ue001", skeleton)
        markup, order = parts[0::2], [int(i) for i in parts[1::2]]  # markup[j] precedes the j-th content
        rendered = self.apply_chat_template(messages, tools)
        for strip in (False, True):  # a template may strip the contents it renders
            contents = [messages[i]["content"].strip() if strip else messages[i]["content"] for i in order]
            if "".join(m + c for m, c in zip(markup, [*contents, ""])) == rendered:
                break
        else:
            raise InvalidRequestError(f"the chat template of {self.name} rewrites message contents, so they "
                                      "cannot be kept apart from its markup: send a rendered prompt to "
                                      "/v1/completions instead")
        ids: list[int] = []
        for m, c in zip(markup, [*contents, ""]):
            ids += self.tokenize(m, add_special=False, special=True) if m else []
            ids += self.tokenize(c, add_special=False, special=False) if c else []
        return ids

    # ---- sequences -------------------------------------------------------
    @abstractmethod
    def new_sequence(self) -> int: ...

    @abstractmethod
    def score(self, seq: int, tokens: list[int]) -> np.ndarray: ...

    def prefill(self, seq: int, tokens: list[int]) -> np.ndarray:
        return self.score(seq, tokens)[-1]

    def score_last(self, seq: int, tokens: list[int], n: int) -> np.ndarray:
        """`score` returning only the last n rows ((n, vocab))."""
        return self.prefill(seq, tokens)[None, :] if n == 1 else self.score(seq, tokens)[-n:]

    def score_batch(self, items: list[tuple[int, list[int]]], last_rows: list[int | None] | None = None,
                    skip_rows: list[Sequence[int]] | None = None) -> list[np.ndarray]:
        """`score` for several sequences; a backend may run them as ONE forward.
        last_rows[i] = n: item i gets its last n rows only (an (n, vocab) array; a
        prefill chunk wants 1, a round folded behind the prompt's last chunk its
        block's); None: every row. skip_rows[i]: indices among those rows whose logits
        the caller does not read (a grammar allows one token there, so its mask makes
        any row one-hot): zeros, which a backend need not compute (here: computed, then
        zeroed, so that every backend gives the caller the same)."""
        wants = last_rows or [None] * len(items)
        out = [self.score(seq, tokens) if n is None or n >= len(tokens) else self.score_last(seq, tokens, n)
               for (seq, tokens), n in zip(items, wants)]
        for rows, skip in zip(out, skip_rows or []):
            if skip:
                rows[list(skip)] = 0.0
        return out

    def batch_order(self, seqs: list[int]) -> list[int]:
        """The order `score_batch` puts these sequences in its forward (default: as given)."""
        return list(seqs)

    def pass_rows(self, blocks: dict[int, int]) -> list[int]:
        """Rows of each pass the backend makes over one `score_batch` forward that
        scores blocks[seq] tokens of each sequence (the cost model prices a shared
        step as the sum of its passes). Default: one pass over every row."""
        total = sum(blocks.values())
        return [total] if total else []

    # ---- hidden states (optional: proposers that draft from the target's own state)
    def enable_hidden(self) -> int:
        """Keep hidden states from now on; returns their size. InvalidRequestError
        if this backend cannot give them."""
        raise InvalidRequestError(f"{self.name} does not expose hidden states (needed by medusa heads): "
                                  f"use a llama.cpp model")

    _hidden_rows: dict[int, tuple[int, np.ndarray]] | None = None  # seq -> (start, rows); set on by enable_hidden

    def hidden_states(self, seq: int) -> tuple[int, np.ndarray] | None:
        """(position of the first row, rows (n, d)) of seq's latest forward, cut to
        what its KV still holds after rollbacks; None if hidden states are off or
        nothing of that forward is left."""
        kept = (self._hidden_rows or {}).get(seq)
        if kept is None:
            return None
        start, rows = kept
        n = min(len(rows), len(self.tokens(seq)) - start)
        return (start, rows[:n]) if n > 0 else None

    def _keep_hidden(self, seq: int, start: int, rows: np.ndarray) -> None:
        if self._hidden_rows is not None:
            self._hidden_rows[seq] = (start, rows)

    @property
    def keeps_hidden(self) -> bool:
        """Whether forwards keep hidden states (enable_hidden was called)."""
        return self._hidden_rows is not None

    def use_threads(self, n_threads: int | None) -> None:
        """Compute with n threads from now on (None: the backend's default)."""

    @abstractmethod
    def rollback(self, seq: int, n_tokens: int) -> None: ...

    @abstractmethod
    def fork(self, seq: int) -> int: ...

    @abstractmethod
    def free(self, seq: int) -> None: ...

    can_copy_kv = False  # save_sequence / load_sequence work (the prefix cache needs them)

    def save_sequence(self, seq: int) -> tuple[object, int]:
        """(a copy of seq's KV, the bytes it takes) for load_sequence."""
        raise InvalidRequestError(f"{self.name} cannot copy its KV out: turn the prefix cache off")

    def load_sequence(self, seq: int, state: object, tokens: list[int]) -> None:
        """Make the empty sequence seq hold `tokens`, from save_sequence's copy of them."""
        raise InvalidRequestError(f"{self.name} cannot copy KV in: turn the prefix cache off")

    @abstractmethod
    def tokens(self, seq: int) -> list[int]:
        """The tokens currently held in seq's KV (a copy)."""

    def close(self) -> None:
        """Release the model. Safe to call twice."""
