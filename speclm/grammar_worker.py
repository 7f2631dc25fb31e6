"""The grammar compile worker: a child process that compiles every new grammar first,
so a crash or a runaway compile inside llguidance costs one request, not the process
(speclm/grammar_safety.py starts it, talks to it and restarts it when it dies).

Standalone on purpose: the standard library, llguidance and (for a GGUF's vocabulary
only) llama-cpp-python, run as a script (`python -P grammar_worker.py`), so it starts
in a fraction of a second and holds nothing of the parent's (no model weights, no
threads of llama.cpp's).

Protocol on stdin/stdout: frames of a 4-byte big-endian length and a pickle.
- ("tokenizer", key, vocabulary): build llguidance's tokenizer for `vocabulary`
  (`_tokenizer`) and keep it under `key`; answers ("ok",).
- ("check", key, source, limits): compile the grammar (llguidance's serialized form)
  against tokenizer `key` as the parent will (`first_steps`) and answer ("ok",) or
  ("error", message); ("unknown",) for a key it no longer holds. A grammar that
  crashes the compiler answers nothing: the process dies, and the parent reads its exit.

Every check runs on a thread with a STACK_MB stack, smaller than the parent's compile
thread's (grammar_safety.COMPILE_STACK_MB), so whatever compiles here has room to
spare there. For a llama.cpp model the tokenizer is the parent's own (the same GGUF
vocabulary through the same bridge), so what fails or takes long here fails or takes
as long there.
"""

from __future__ import annotations

import pickle
import struct
import sys
import threading
from collections import OrderedDict

STACK_MB = 16


def _read(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _tokenizer(vocabulary: tuple):
    """llguidance's tokenizer for a vocabulary the parent describes:
    ("llama", path, eos, n_vocab): the GGUF's own vocabulary, loaded alone (vocab_only),
    through llguidance's llama.cpp bridge, as the parent builds it: the same tokenizer;
    ("tokens", tokens, eos, n_vocab): the token bytes (special ones prefixed with 0xff),
    tokenized greedily (the parent's backend has no vocabulary this process can load)."""
    from llguidance import LLTokenizer, TokenizerWrapper
    if vocabulary[0] == "llama":
        import llama_cpp as L
        _, path, eos, n_vocab = vocabulary
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = True
        model = L.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise RuntimeError("llama.cpp could not load the model's vocabulary")
        _MODELS.append(model)  # the vocabulary lives as long as its model
        return llama_tokenizer(L.llama_model_get_vocab(model), n_vocab, eos)
    _, tokens, eos, n_vocab = vocabulary

    class Vocabulary:
        def __init__(self, greedy=None):
            self.tokens, self.eos_token_id, self.bos_token_id = tokens, eos[0], None
            self.special_token_ids, self.greedy = list(eos), greedy

        def __call__(self, text):
            if self.greedy is None:
                return []
            return self.greedy(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

    trie = LLTokenizer(TokenizerWrapper(Vocabulary()), n_vocab=n_vocab, eos_token=eos)
    return LLTokenizer(TokenizerWrapper(Vocabulary(trie.greedy_tokenize)), n_vocab=n_vocab, eos_token=eos)


_MODELS: list = []


def llama_tokenizer(vocab, n_vocab: int, eos: list[int]):
    """llguidance's tokenizer over a llama.cpp vocabulary, built as llguidance's own bridge
    (llguidance.llamacpp.lltokenizer_from_vocab) builds it: each token's piece with special
    text, control and <...> user-defined tokens prefixed with 0xff, padded to n_vocab, and
    llama.cpp's tokenizer. Written out because the bridge calls llama-cpp-python's
    deprecated token-attribute alias, a DeprecationWarning per token. The server and this
    worker both build theirs here, so the two are the same."""
    import ctypes

    import llama_cpp as L
    from llguidance import LLTokenizer
    size = 16 * 1024
    buffer = ctypes.create_string_buffer(size + 1)
    tokens = []
    for token in range(L.llama_vocab_n_tokens(vocab)):
        n = L.llama_token_to_piece(vocab, token, buffer, size, 0, True)
        if n < 0:
            raise ValueError(f"token {token}'s piece does not fit {size} bytes")
        piece = bytes(buffer[:n])
        attr = L.llama_vocab_get_attr(vocab, token)
        if attr & L.LLAMA_TOKEN_ATTR_CONTROL or (attr & L.LLAMA_TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<")
                                                 and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    tokens += [b""] * (n_vocab - len(tokens))
    tokenize = ctypes.cast(L.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab, tokenize_fptr=tokenize, eos_token=eos,
                                     slices=None)


def first_steps(tokenizer, source: str, limits: dict) -> tuple:
    """Compile a grammar and run what a request's first round computes before its first
    token: validate, the matcher, the first mask, the forced run (fast-forward tokens) and
    the mask after it. (matcher back at the start, the first mask's bits, None), or
    (None, None, llguidance's error): a grammar over llguidance's limits there fails now.
    The parent (speclm/constraints.py) runs this same function after the worker did."""
    from llguidance import LLMatcher, LLParserLimits
    parser_limits = LLParserLimits(**limits)
    error = LLMatcher.validate_grammar(source, tokenizer, limits=parser_limits)
    if error and not error.startswith("WARNING"):
        return None, None, error
    matcher = LLMatcher(tokenizer, source, log_level=0, limits=parser_limits)
    first = b"" if matcher.is_error() else matcher.compute_bitmask()
    forced = [] if matcher.is_error() else matcher.compute_ff_tokens()
    if forced and not matcher.is_error() and matcher.consume_tokens(forced):
        if not matcher.is_stopped():
            matcher.compute_bitmask()
        if not matcher.is_error():
            matcher.rollback(len(forced))
    if matcher.is_error():
        return None, None, matcher.get_error()
    return matcher, first, None


def serve(inp, out) -> None:
    tokenizers: OrderedDict = OrderedDict()  # the last few vocabularies (a model's tokenizer is tens of MB)
    while True:
        head = _read(inp, 4)
        if head is None:
            return
        body = _read(inp, struct.unpack(">I", head)[0])
        if body is None:
            return
        message = pickle.loads(body)
        try:
            if message[0] == "tokenizer":
                _, key, vocabulary = message
                tokenizers[key] = _tokenizer(vocabulary)
                while len(tokenizers) > 4:
                    tokenizers.popitem(last=False)
                answer: tuple = ("ok",)
            elif message[0] == "check":
                _, key, source, limits = message
                if key in tokenizers:
                    tokenizers.move_to_end(key)
                    error = first_steps(tokenizers[key], source, limits)[2]
                    answer = ("ok",) if error is None else ("error", error)
                else:
                    answer = ("unknown",)
            else:
                answer = ("error", f"unknown message {message[0]!r}")
        except Exception as exc:  # noqa: BLE001 - the parent turns it into the request's 400
            answer = ("error", f"{type(exc).__name__}: {exc}")
        data = pickle.dumps(answer)
        out.write(struct.pack(">I", len(data)) + data)
        out.flush()


def main() -> None:
    threading.stack_size(STACK_MB << 20)
    worker = threading.Thread(target=serve, args=(sys.stdin.buffer, sys.stdout.buffer), name="grammar-check")
    worker.start()
    worker.join()


if __name__ == "__main__":
    main()
