"""llama.cpp backend through llama-cpp-python's low-level (ctypes) API.

One model, one context with a unified multi-sequence KV memory. `score`
submits one batch with logits requested for every position; rollback is
`llama_memory_seq_rm`, fork is `llama_memory_seq_cp` (no recompute).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .. import native
from ..errors import BackendError, InvalidRequestError, ModelError
from ..llama_lib import L, init_once, last_error, recent_errors
from .base import KV_SEQUENCES, N_CTX, Backend
from .kernels import KernelConfig

MAX_THREADS = 512  # ggml's limit


# Every llama_decode of the process runs on this one thread. libgomp gives each calling
# thread its own OpenMP team, and once the teams hold more threads than there are cores
# it stops spinning at barriers and sleeps instead: measured here, decoding from a second
# Python thread (the engine's, the server's) after the main thread had decoded ran at
# 85-125 ms/token instead of 57, as long as the process lived.
_compute_ident: list[int] = []  # the compute thread's ident, recorded when it starts
_compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-compute",
                              initializer=lambda: _compute_ident.append(threading.get_ident()))


def _decode(ctx, batch) -> int:
    """llama_decode on the compute thread (the caller blocks without spinning)."""
    if _compute_ident and threading.get_ident() == _compute_ident[0]:
        return L.llama_decode(ctx, batch)
    return _compute.submit(L.llama_decode, ctx, batch).result()


def _output_rows(n: int, n_out: int, skip: Set[int]) -> list[int]:
    """llama_batch logits flags for a block of n rows: its last n_out rows but `skip`
    (indices among those)."""
    first = n - n_out
    return [int(i >= first and i - first not in skip) for i in range(n)]


def _unpack(computed: np.ndarray, n_out: int, skip: Set[int]) -> np.ndarray:
    """The (n_out, vocab) rows a caller asked for, from the ones llama.cpp computed (all
    but `skip`, in order); zeros at `skip`."""
    if not skip:
        return computed.copy()
    out = np.zeros((n_out, computed.shape[1]), dtype=np.float32)
    out[[j for j in range(n_out) if j not in skip]] = computed
    return out


class LlamaCppBackend(Backend):
    """A GGUF model run by llama.cpp on the CPU."""

    def __init__(self, path: str | Path, n_ctx: int = N_CTX, n_threads: int | None = None,
                 n_seq_max: int = KV_SEQUENCES, kernels: KernelConfig | None = None):
        """kernels: the weight buffers to use (None: llama.cpp's default). Choose them
        with `load_backend`, which proves them on this machine first (probe.py)."""
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int)
                                      or not 1 <= n_threads <= MAX_THREADS):
            raise InvalidRequestError(f"n_threads must be an integer in [1, {MAX_THREADS}] (--threads), "
                                      f"got {n_threads!r}")
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 16:
            raise InvalidRequestError(f"n_ctx must be an integer >= 16 (--n-ctx), got {n_ctx!r}")
        init_once()
        self.path = Path(path)
        self.name = str(self.path)
        mparams = L.llama_model_default_params()
        if kernels is not None:
            mparams.use_extra_bufts = kernels.use_extra_bufts
        recent_errors.clear()
        claims = kernels is not None and kernels.claims
        with native.claiming(claims, claims and kernels.interleaved):
            self._model = L.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise ModelError(f"llama.cpp could not load {self.path}: {last_error()}; the file is corrupt, "
                             f"incomplete or not a supported GGUF model: re-download or re-convert it "
                             f"(registered models: `speclm models verify NAME --repair`)")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.vocab_size = int(L.llama_vocab_n_tokens(self._vocab))
        n_train = int(L.llama_model_n_ctx_train(self._model))
        self.n_ctx = min(n_ctx, n_train) if n_train > 0 else n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        if not isinstance(n_seq_max, int) or not 1 <= n_seq_max <= 64:
            raise InvalidRequestError(f"the number of sequences must be in [1, 64], got {n_seq_max!r}")
        cparams = L.llama_context_default_params()
        # One KV stream per sequence (kv_unified off), each of n_ctx cells: a token then
        # attends over its own sequence's cells only, not every sequence's. Measured on the
        # 1.5B target, 16 sequences of 200 tokens: one 16x1-token forward 444-570 ms vs
        # 479-649 ms unified, 8x1 331-358 vs 414-468 (two interleaved runs).
        cparams.n_ctx = self.n_ctx * n_seq_max
        cparams.n_batch = self.n_ctx
        self.n_ubatch = min(512, self.n_ctx)
        cparams.n_ubatch = self.n_ubatch
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.kv_unified = False
        cparams.no_perf = True
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_NONE  # hidden states (when enabled) per row, not pooled
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            L.llama_model_free(self._model)
            self._model = None
            raise BackendError(f"llama.cpp could not create a context for {self.path} (n_ctx={self.n_ctx})")
        self._mem = L.llama_get_memory(self._ctx)
        self._embeddings_on = False  # llama.cpp then makes every row an output (enable_hidden)
        self._batch = L.llama_batch_init(self.n_ctx, 0, 1)
        self.max_sequences = n_seq_max
        self._free_ids = list(range(n_seq_max))  # KV streams (llama.cpp sequence ids) not in use
        self._stream: dict[int, int] = {}  # our sequence handle -> its KV stream
        self._passes: dict[tuple, list[int]] = {}  # pass_rows by blocks, while the streams stay put
        self._handles = itertools.count()
        self._held: dict[int, list[int]] = {}
        self._pieces: dict[int, bytes] = {}
        bos = int(L.llama_vocab_bos(self._vocab))
        self.bos_id = bos if bos >= 0 else None
        self.eos_ids = frozenset(t for t in range(self.vocab_size) if L.llama_vocab_is_eog(self._vocab, t))

    # ---- tokenizer -----------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, special)
        if n < 0:
            raise BackendError(f"tokenizer failed on a {len(data)}-byte text")
        return list(buf[:n])

    @property
    def llama_vocab(self):
        """llama.cpp's vocabulary handle (the grammar engine builds its tokenizer from it)."""
        return self._vocab

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(256)
            n = L.llama_token_to_piece(self._vocab, token, buf, 256, 0, False)
            piece = buf.raw[:max(n, 0)]
            self._pieces[token] = piece
        return piece

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry itself (special tokens included)."""
        return L.llama_vocab_get_text(self._vocab, token) or b""

    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        from .chat_template import render_chat
        template = self.chat_template()
        if not template:
            raise InvalidRequestError(f"{self.path.name} has no chat template: drop --chat")
        return render_chat(template, messages, self._special_text(self.bos_id),
                           self._special_text(int(L.llama_vocab_eos(self._vocab))), tools=tools)

    def _special_text(self, token: int | None) -> str:
        return "" if token is None or token < 0 else self.token_text(token).decode("utf-8", "replace")

    # ---- sequences -----------------------------------------------------
    def describe(self) -> str | None:
        """llama.cpp's one-line description of the model (architecture, size, file type)."""
        if not self._model:
            return None
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n > 0 else None

    def new_sequence(self) -> int:
        if not self._free_ids:
            raise BackendError(f"all {len(self._held)} KV sequences of {self.path.name} are in use")
        stream = min(self._free_ids)  # the lowest: live streams stay one run of ids (pass_rows)
        self._free_ids.remove(stream)
        L.llama_memory_seq_rm(self._mem, stream, 0, -1)
        sid = next(self._handles)
        self._stream[sid], self._held[sid] = stream, []
        self._passes.clear()
        return sid

    def score(self, seq: int, tokens: list[int]) -> np.ndarray:
        return self._decode(seq, tokens, len(tokens))

    def score_last(self, seq: int, tokens: list[int], n: int) -> np.ndarray:
        return self.prefill(seq, tokens)[None, :] if n == 1 else self._decode(seq, tokens, n)

    def prefill(self, seq: int, tokens: list[int]) -> np.ndarray:
        if self._hidden_rows is not None and len(tokens) > 1:
            # With embeddings on, llama.cpp outputs EVERY row (the output head over a whole
            # prompt: seconds); only the last row's hidden state is wanted.
            self._set_embeddings(False)
            try:
                self._decode(seq, tokens[:-1], 1)
            finally:
                self._set_embeddings(True)
            tokens = tokens[-1:]
        return self._decode(seq, tokens, 1)[-1]

    def enable_hidden(self) -> int:
        """Turn llama.cpp's per-row embeddings on (pooling NONE: the final-norm hidden
        state, which the output matrix multiplies into the logits)."""
        if self._hidden_rows is None:
            self._set_embeddings(True)
            self._hidden_rows = {}
        return self.hidden_size

    def _set_embeddings(self, on: bool) -> None:
        L.llama_set_embeddings(self._ctx, on)
        self._embeddings_on = on

    @property
    def hidden_size(self) -> int:
        return int(L.llama_model_n_embd(self._model))

    def _fill(self, at: int, seq: int, tokens: list[int], n_out: int, skip: Set[int]) -> int:
        """Put seq's tokens in the batch from row `at` on, at the positions after what seq
        holds, with output flags for their last n_out rows but `skip`; returns the next
        free row. InvalidRequestError where seq would overflow its context."""
        b, start, stream = self._batch, len(self._held[seq]), self._stream[seq]
        if start + len(tokens) > self.n_ctx:
            raise InvalidRequestError(f"sequence would hold {start + len(tokens)} tokens; "
                                      f"the context holds {self.n_ctx}")
        for j, (tok, out) in enumerate(zip(tokens, _output_rows(len(tokens), n_out, skip))):
            b.token[at + j] = tok
            b.pos[at + j] = start + j
            b.n_seq_id[at + j] = 1
            b.seq_id[at + j][0] = stream
            b.logits[at + j] = out
        return at + len(tokens)

    def _decode(self, seq: int, tokens: list[int], n_out: int, skip: Set[int] = frozenset()) -> np.ndarray:
        """One forward of tokens appended to seq: the logits of its last n_out rows, zeros
        at `skip` (indices among them) where the output head was not run."""
        held = self._held[seq]
        n = len(tokens)
        if n == 0:
            raise BackendError("score called with no tokens")
        start = len(held)
        self._batch.n_tokens = self._fill(0, seq, tokens, n_out, skip)
        rc = _decode(self._ctx, self._batch)
        if rc != 0:
            L.llama_memory_seq_rm(self._mem, self._stream[seq], start, -1)
            raise BackendError(f"llama_decode failed with code {rc} on {n} tokens at position {start}: "
                               f"{last_error()}")
        held.extend(int(t) for t in tokens)
        if self._embeddings_on:  # llama.cpp made every row an output
            rows = np.ctypeslib.as_array(L.llama_get_embeddings(self._ctx), shape=(n, self.hidden_size))
            self._keep_hidden(seq, start, rows.copy())
            logits = np.ctypeslib.as_array(L.llama_get_logits(self._ctx), shape=(n, self.vocab_size))
            return logits[n - n_out:].copy()
        ptr = L.llama_get_logits(self._ctx)
        return _unpack(np.ctypeslib.as_array(ptr, shape=(n_out - len(skip), self.vocab_size)), n_out, skip)

    def score_batch(self, items: list[tuple[int, list[int]]], last_rows: list[int | None] | None = None,
                    skip_rows: list[Sequence[int]] | None = None) -> list[np.ndarray]:
        """All items in ONE llama_decode (each sequence at its own positions), the
        output head run only over the rows asked for (`Backend.score_batch`)."""
        wants = [len(t) if n is None else min(n, len(t)) for (_, t), n in zip(items, last_rows or [None] * len(items))]
        skips = [frozenset(j for j in skip if 0 <= j < n) for skip, n in zip(skip_rows or [()] * len(items), wants)]
        total = sum(len(t) for _, t in items)
        if total == 0 or total > self.n_ctx or self._hidden_rows is not None:
            # (hidden states on: llama.cpp would run the output head over every prefill row)
            return super().score_batch(items, last_rows, skip_rows)
        if len(items) == 1:
            return [self._decode(items[0][0], items[0][1], wants[0], skips[0])]
        order = sorted(range(len(items)), key=lambda k: self._stream[items[k][0]])  # batch_order
        i, rows = 0, []
        for seq, tokens, n_out, skip in ((*items[k], wants[k], skips[k]) for k in order):
            i = self._fill(i, seq, tokens, n_out, skip)
            rows.append(n_out - len(skip))
        self._batch.n_tokens = total
        rc = _decode(self._ctx, self._batch)
        if rc != 0:
            for seq, _ in items:
                L.llama_memory_seq_rm(self._mem, self._stream[seq], len(self._held[seq]), -1)
            raise BackendError(f"llama_decode failed with code {rc} on a batch of {total} tokens: {last_error()}")
        logits = np.ctypeslib.as_array(L.llama_get_logits(self._ctx), shape=(sum(rows), self.vocab_size))
        out, i = [None] * len(items), 0
        for k, n in zip(order, rows):
            seq, tokens = items[k]
            self._held[seq].extend(int(t) for t in tokens)
            out[k] = _unpack(logits[i:i + n], wants[k], skips[k])
            i += n
        return out

    def batch_order(self, seqs: list[int]) -> list[int]:
        """By stream id: llama.cpp puts only consecutive, increasing ids in one pass (pass_rows)."""
        return sorted(seqs, key=self._stream.__getitem__)

    def pass_rows(self, blocks: dict[int, int]) -> list[int]:
        """With one KV stream per sequence llama.cpp splits a forward into passes
        (split_equal, sequential): a pass takes the lowest stream still holding
        tokens and the run of consecutive stream ids after it, and the same number
        of tokens from each (at most n_ubatch rows). So a block longer than the
        others costs passes of its own (15 one-token blocks and one of 5: a 16-row
        pass, then a 4-row one); a gap in the ids would too, but new_sequence and
        free keep the live streams one run.
        Remembered until a sequence is taken or freed (streams move then): a
        batching controller prices the same step shapes every step, ~400 times
        a step at 16 requests."""
        if self.max_sequences == 1:
            return super().pass_rows(blocks)
        key = tuple(blocks.items())
        rows = self._passes.get(key)
        if rows is None:
            if len(self._passes) >= 4096:
                self._passes.clear()
            rows = self._passes[key] = self._split_passes(blocks)
        return list(rows)

    def _split_passes(self, blocks: dict[int, int]) -> list[int]:
        # a handle not live (yet): a stream of its own
        streams = {self._stream.get(h, -2 * (i + 1)): n for i, (h, n) in enumerate(blocks.items())}
        left, rows = {s: n for s, n in sorted(streams.items()) if n > 0}, []
        while left:
            run = [next(iter(left))]
            while run[-1] + 1 in left:
                run.append(run[-1] + 1)
            per_seq = min(min(left[s] for s in run), max(1, self.n_ubatch // len(run)))
            rows.append(per_seq * len(run))
            for s in run:
                left[s] -= per_seq
                if not left[s]:
                    del left[s]
        return rows

    def use_threads(self, n_threads: int | None) -> None:
        n = n_threads or self.n_threads
        if n != getattr(self, "_threads_now", self.n_threads):
            L.llama_set_n_threads(self._ctx, n, n)
            self._threads_now = n

    def rollback(self, seq: int, n_tokens: int) -> None:
        held = self._held[seq]
        if n_tokens < len(held):
            L.llama_memory_seq_rm(self._mem, self._stream[seq], n_tokens, -1)
            del held[n_tokens:]

    def fork(self, seq: int) -> int:
        sid = self.new_sequence()
        L.llama_memory_seq_cp(self._mem, self._stream[seq], self._stream[sid], -1, -1)
        self._held[sid] = list(self._held[seq])
        return sid

    def free(self, seq: int) -> None:
        if self._hidden_rows is not None:
            self._hidden_rows.pop(seq, None)
        if seq in self._held:
            self._passes.clear()
            stream = self._stream.pop(seq)
            L.llama_memory_seq_rm(self._mem, stream, 0, -1)
            del self._held[seq]
            last = max(self._stream, key=self._stream.get, default=None)
            if last is not None and self._stream[last] > stream:
                # Close the gap: the highest stream moves into the freed one (a whole-stream
                # copy, done at the next llama_decode), so live streams stay one run of ids.
                top, self._stream[last] = self._stream[last], stream
                L.llama_memory_seq_cp(self._mem, top, stream, -1, -1)
                L.llama_memory_seq_rm(self._mem, top, 0, -1)
                stream = top
            self._free_ids.append(stream)

    can_copy_kv = True

    def save_sequence(self, seq: int) -> tuple[object, int]:
        """llama.cpp's serialised KV of seq's stream (host memory, ~28 KB a token on the 1.5B)."""
        stream = self._stream[seq]
        size = L.llama_state_seq_get_size(self._ctx, stream)
        buf = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data(self._ctx, buf, size, stream) != size:
            raise BackendError(f"llama.cpp could not copy out the KV of a {len(self._held[seq])}-token sequence")
        return buf, size

    def load_sequence(self, seq: int, state: object, tokens: list[int]) -> None:
        if self._held[seq]:
            raise BackendError("load_sequence needs an empty sequence")
        if L.llama_state_seq_set_data(self._ctx, state, len(state), self._stream[seq]) == 0:
            L.llama_memory_seq_rm(self._mem, self._stream[seq], 0, -1)
            raise BackendError(f"llama.cpp could not restore a {len(tokens)}-token KV copy: {last_error()}")
        self._held[seq] = [int(t) for t in tokens]

    def tokens(self, seq: int) -> list[int]:
        return list(self._held[seq])

    @property
    def live_sequences(self) -> int:
        return len(self._held)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            L.llama_batch_free(self._batch)
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
