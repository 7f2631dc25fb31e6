"""Structured outputs: a grammar the output must match, as a per-row logit processor.

A `Grammar` (JSON schema, any JSON object, a regex or a Lark grammar) is a
sampling setting; `GrammarMask` is one request's matcher for it (llguidance,
the grammar engine llama.cpp and vLLM use). Contracts, the same as
`sampling.Processors`':

- `process(rows, draft)`: row i masked with the grammar's state after the
  output so far plus draft[:i] (tokens it forbids get logit -inf), so every
  row is masked as constrained plain decoding masks it at that position.
- `advance(tokens)`: the request emitted tokens; only these enter the state
  (a draft is consumed for the masks and rolled back).
- `forced()`, `consume(tokens)`, `rollback(n)`, `stopped()`: the matcher's own
  steps, for stage 1's use of the grammar (speculative/grammar_draft.py clips a
  draft and appends the runs the grammar forces; docs/design.md#structured-outputs).

Lossless: the target distribution of a constrained request is the masked p,
and speculation accepts and resamples against exactly that p. Clipping is
lossless for a deterministic draft token (its residual is p itself, as p gives
the forbidden token 0) and for greedy or seeded requests; a token drawn from a
q by an unseeded sampled request keeps its forbidden token in the block, so it
is rejected and the next token drawn from the residual max(0, p - q) as usual.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InvalidRequestError
from .grammar_bounds import check_bounds
from .grammar_safety import PARSER_LIMITS, WORKER, GrammarCrash, on_big_stack
from .grammar_worker import first_steps, llama_tokenizer

# Grammar kinds a request may name, with what their text holds.
KINDS = {"json_schema": "a JSON schema (JSON text)", "regex": "a regular expression",
         "lark": "a Lark grammar (llguidance's dialect)"}
# JSON layout the schema grammars force: one space after ':' and ',' (Python's json.dumps),
# no other whitespace, so keys, quotes and separators are forced runs.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """What the output must match: kind in KINDS, text its source."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise InvalidRequestError(f"the {self.kind} grammar is empty: give {KINDS[self.kind]}")

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        """The output is one JSON value valid under `schema` (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))  # key order kept: llguidance emits properties in it

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's response_format json_object)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """The output matches `pattern` (whole)."""
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        """The output is a sentence of a Lark grammar (llguidance's dialect: `start` is the
        root, %json{...} embeds a JSON schema, <name> a special token)."""
        return cls("lark", grammar)

    @classmethod
    def of(cls, value: object) -> Grammar | None:
        """A Grammar from itself, None, or its dict form ({"kind", "text"}, as the SSD wire sends it)."""
        if value is None or isinstance(value, Grammar):
            return value
        if isinstance(value, dict) and set(value) == {"kind", "text"}:
            return cls(value["kind"], value["text"])
        raise InvalidRequestError(f"grammar must be a speclm.Grammar, got {value!r}")

    def source(self) -> str:
        """The grammar in llguidance's serialized form."""
        from llguidance import LLMatcher
        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.text, overrides=JSON_LAYOUT)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.text)
        return LLMatcher.grammar_from_lark(self.text)


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> its _Compiled


def tokenizer_for(backend):
    """llguidance's view of the backend's vocabulary (built once per backend, ~1-2 s on a
    150k vocabulary). llama.cpp: llguidance's own bridge over the GGUF vocabulary (control
    and <...> user tokens are special, text tokens are their bytes); any other backend:
    its token bytes and tokenizer, with its end tokens special."""
    return _compiled(backend).tokenizer


class _Compiled:
    """One backend's grammar state: llguidance's tokenizer over its vocabulary, what the
    compile worker builds its own from (`vocabulary`), and the grammars compiled so far (by
    kind and text: a matcher to copy and its first mask, or the error message), the last
    CACHED_GRAMMARS."""

    def __init__(self, backend):
        eos = sorted(backend.eos_ids)
        if not eos:
            raise InvalidRequestError(f"{model_label(backend)} has no end-of-text token, so a grammar cannot end: "
                                      "structured outputs need a model with one")
        self.backend, self.eos = weakref.ref(backend), eos
        vocab = getattr(backend, "llama_vocab", None)
        if vocab is not None and getattr(backend, "path", None) is not None:
            self.tokenizer = llama_tokenizer(vocab, backend.vocab_size, eos)  # the compile worker's too
            self._tokens = None
        else:
            from llguidance import LLTokenizer, TokenizerWrapper
            words = _Vocabulary(backend, eos)
            self.tokenizer = LLTokenizer(TokenizerWrapper(words), n_vocab=backend.vocab_size, eos_token=eos)
            self._tokens = words.tokens
        self.key: str | None = None
        self.lock = threading.Lock()
        self.grammars: OrderedDict[tuple[str, str], object] = OrderedDict()

    @property
    def faithful(self) -> bool:
        """Whether the compile worker's tokenizer is this one (a GGUF vocabulary it loads
        itself): then its errors are this process's, and need not be found again here."""
        return self._tokens is None

    def vocabulary(self) -> tuple:
        """The vocabulary as the compile worker builds its tokenizer (grammar_worker._tokenizer):
        a GGUF's path, or each token's bytes as the tokenizer above holds them."""
        backend = self.backend()
        if self._tokens is None:
            return ("llama", str(backend.path), self.eos, backend.vocab_size)
        return ("tokens", self._tokens, self.eos, backend.vocab_size)

    def worker_key(self) -> str:
        if self.key is None:
            vocabulary = self.vocabulary()
            digest = hashlib.sha256(repr((vocabulary[0], vocabulary[2:])).encode())
            for t in [vocabulary[1]] if isinstance(vocabulary[1], str) else vocabulary[1]:
                t = t.encode() if isinstance(t, str) else t
                digest.update(len(t).to_bytes(4, "little") + t)
            self.key = digest.hexdigest()
        return self.key


_STATES_LOCK = threading.Lock()  # one tokenizer build per backend, whichever thread asks first


def _compiled(backend) -> _Compiled:
    state = _TOKENIZERS.get(backend)
    if state is None:
        with _STATES_LOCK:
            state = _TOKENIZERS.get(backend)
            if state is None:
                state = _TOKENIZERS[backend] = _Compiled(backend)
    return state


class _Vocabulary:
    """A backend's vocabulary in the shape llguidance's TokenizerWrapper reads."""

    def __init__(self, backend, eos: list[int]):
        self.backend = backend
        self.eos_token_id, self.bos_token_id = eos[0], backend.bos_id
        self.special_token_ids = eos
        self.tokens = [b"\xff<eos>" if t in eos else backend.token_bytes(t) for t in range(backend.vocab_size)]

    def __call__(self, text: str) -> list[int]:
        return self.backend.tokenize(text, add_special=False, special=False)


def model_label(backend) -> str:
    """The backend as a client may read it in a message: its model file's name, never the
    file's path on the server."""
    return Path(str(backend.name)).name or str(backend.name)


CACHED_GRAMMARS = 64  # per backend: compiled matchers and errors kept by the grammar's text


def matcher_for(grammar: Grammar, backend):
    """The grammar compiled against the backend's vocabulary, its first steps run (first
    mask, forced run): an LLMatcher to deep_copy, never to advance or compute a mask on
    (requests in other threads copy it); or InvalidRequestError with llguidance's message
    or the bound it is over. Compiled safely (speclm/grammar_safety.py: bounds, then the
    compile worker, then this process on a thread with a big stack) once per text; later
    calls with the same grammar, errors included, are a dictionary look-up."""
    state = _compiled(backend)
    key = (grammar.kind, grammar.text)
    with state.lock:
        known = state.grammars.get(key)
        if known is not None:
            state.grammars.move_to_end(key)
    if known is None:
        try:
            known = _compile(grammar, state)
        except InvalidRequestError as exc:
            if getattr(exc, "transient", False):  # a timeout: not remembered
                raise
            known = str(exc)
        with state.lock:
            state.grammars[key] = known
            while len(state.grammars) > CACHED_GRAMMARS:
                state.grammars.popitem(last=False)
    if isinstance(known, str):
        raise InvalidRequestError(known)
    return known[0]


def warm(backend) -> None:
    """Build the backend's tokenizer and start the compile worker with its own, so the
    first request with a grammar does not wait for them (a server calls this at start, in
    the background). Never raises: a failure here is met again, and reported, by
    `matcher_for`."""
    try:
        state = _compiled(backend)
        WORKER.prepare(state.worker_key(), state.vocabulary)
    except Exception:  # noqa: BLE001
        pass


def first_allowed(grammar: Grammar, backend) -> np.ndarray:
    """Which tokens the grammar allows as the first token (bool per vocabulary entry),
    from its compile (`matcher_for`; InvalidRequestError as there)."""
    matcher_for(grammar, backend)
    with _compiled(backend).lock:
        bits = _compiled(backend).grammars[(grammar.kind, grammar.text)][1]
    return _unpack(bits, backend.vocab_size)


def _unpack(bitmask: bytes, vocab_size: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")[:vocab_size].astype(bool)


def _compile(grammar: Grammar, state: _Compiled) -> tuple:
    check_bounds(grammar.kind, grammar.text)
    try:
        source = grammar.source()
    except ValueError as e:
        raise InvalidRequestError(f"the {grammar.kind} grammar cannot be compiled: {_one_line(str(e))}") from None
    try:
        error = WORKER.check(state.worker_key(), state.vocabulary, source)
    except GrammarCrash as e:
        err = InvalidRequestError(f"the {grammar.kind} grammar cannot be compiled: {e}; simplify it")
        err.transient = e.transient
        raise err from None
    if error is None or not state.faithful:  # it compiled there, so it compiles here, on a bigger stack
        matcher, first, error = on_big_stack(lambda: first_steps(state.tokenizer, source, PARSER_LIMITS))
    if error is not None:
        raise InvalidRequestError(f"the {grammar.kind} grammar cannot be compiled: {_one_line(error)}")
    return matcher, first  # never advanced: requests advance deep copies


def check_grammar(grammar: Grammar, backend) -> str:
    """The grammar's llguidance form, or InvalidRequestError with llguidance's message (or
    the bound it is over); compiled as `matcher_for` does, so it can never crash the process."""
    matcher_for(grammar, backend)
    return grammar.source()


def _one_line(message: str) -> str:
    """llguidance's message on one line (its caret-only lines dropped)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip().strip("^"))


class GrammarMask:
    """One request's grammar state: masks rows, clips drafts, supplies forced tokens."""

    def __init__(self, grammar: Grammar, backend):
        self.grammar, self.vocab_size = grammar, backend.vocab_size
        self.matcher = matcher_for(grammar, backend).deep_copy()
        self._check()
        self.forced_emitted = 0  # emitted tokens that were drafted because the grammar forced them

    def _check(self) -> None:
        if self.matcher.is_error():
            raise InvalidRequestError(f"the {self.grammar.kind} grammar failed: {self.matcher.get_error()}")

    def allowed(self) -> np.ndarray:
        """Which tokens the grammar allows next (bool per vocabulary entry)."""
        return _unpack(self.matcher.compute_bitmask(), self.vocab_size)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of tokens the grammar accepts in order from the current state."""
        return self.matcher.validate_tokens(list(tokens)) if tokens else 0

    def process(self, rows: np.ndarray, draft: list[int]) -> np.ndarray:
        """A copy of rows with row i masked after draft[:i]; rows past a draft token the
        grammar forbids (never accepted: p gives it 0) repeat the last mask."""
        out = np.array(rows, dtype=np.float64)
        consumed = 0
        allowed = self.allowed()
        for i, row in enumerate(out):
            if i and consumed == i - 1 and self.valid_prefix([draft[i - 1]]) == 1:
                self.matcher.consume_token(draft[i - 1])
                consumed += 1
                allowed = self.allowed()
            row[~allowed] = -np.inf
        if consumed:
            self.matcher.rollback(consumed)
        self._check()
        return out

    def certain_rows(self, tokens: list[int], candidates: Sequence[int]) -> tuple[int, ...]:
        """The draft positions among `candidates` (the forced ones: shape's result) where
        the grammar allows exactly one token after tokens[:i]. Their masked p is one-hot
        whatever the logits, so the target need not compute those rows' logits. A forced
        (fast-forward) token need not be one: `{"` forced may still allow `{`."""
        certain, pos = [], 0
        try:
            for i in sorted(c for c in candidates if c < len(tokens)):
                if i > pos:
                    self.matcher.consume_tokens(list(tokens[pos:i]))
                    pos = i
                if self.matcher.is_stopped():
                    break
                if np.count_nonzero(self.allowed()) == 1:
                    certain.append(i)
        finally:
            if pos:
                self.matcher.rollback(pos)
        self._check()
        return tuple(certain)

    def advance(self, tokens: list[int]) -> None:
        """The request emitted tokens (each one the masked p allowed; once the grammar is
        complete, only an end token, which ends the request)."""
        for token in tokens:
            if self.matcher.is_stopped():
                return
            if not self.matcher.consume_token(int(token)):
                raise RuntimeError(f"grammar state lost: emitted token {token} was not allowed "
                                   f"({self.matcher.get_error()})")

    def forced(self) -> list[int]:
        """The tokens the grammar forces from the current state (llguidance's fast-forward run)."""
        return list(self.matcher.compute_ff_tokens())

    def consume(self, tokens: Sequence[int]) -> None:
        """Enter tokens the grammar allows into the state (a draft's, to be rolled back)."""
        if tokens:
            self.matcher.consume_tokens(list(tokens))

    def rollback(self, n: int) -> None:
        """Take the last n consumed tokens back out of the state, and check it is sound."""
        if n:
            self.matcher.rollback(n)
        self._check()

    def stopped(self) -> bool:
        """Whether the grammar is complete: nothing but an end token may follow."""
        return self.matcher.is_stopped()
