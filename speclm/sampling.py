"""Sampling parameters and the logits processor.

Contract: `target_probs(logits, params)` returns THE distribution the request
samples from (temperature, top-k, top-p, min-p applied, renormalised). Plain
decoding samples from it; speculative decoding accepts and resamples against
it. Both call this one function, so the two can never disagree on what "the
target distribution" is.

How a token is drawn from it (`draw`): with a seed, by Gumbel-max with noise
keyed by (seed, position) (`keyed_sample`), so the token at a position is a
function of the seed, the position and p alone, whatever drew the tokens
before it; without one, by inverse CDF from the request's generator
(`sample`). docs/design.md#seeded-sampling.

Before that, the request's logit processors (`Processors`: logit_bias, then the
repetition, presence and frequency penalties) turn the model's raw logits into
the logits `target_probs` reads. Under speculation row i of a verify block is
processed with its own prefix (the output so far plus the draft's first i
tokens), so every row is processed exactly as plain decoding would process it
at that position (docs/design.md#processed-distributions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .constraints import Grammar
from .errors import InvalidRequestError
from .metrics import TokenLogprob
from .options import option

MAX_LOGPROBS = 20  # OpenAI's bound on top_logprobs / logprobs
REPEAT_WINDOW = 64  # repetition_penalty looks at the last this many context tokens (llama.cpp's repeat_last_n)
BIAS_LIMIT = 100.0  # logit_bias values lie in [-100, 100]; -100 bans a token and 100 forces it (OpenAI's)


@dataclass(frozen=True)
class SamplingParams:
    """How the target distribution is derived from the model's logits.

    temperature == 0 means greedy (argmax). top_k == 0 and top_p == 1.0 and
    min_p == 0.0 disable those filters. `seed` makes a run reproducible, and
    equal to plain decoding's with that seed (`draw`). Each
    field is a declared setting: the commands' flags and the server's request
    fields are generated from it (speclm/options.py).
    """

    temperature: float = option(0.0, "0 = greedy (default); the server's default is OpenAI's, 1",
                                request=True)
    top_k: int = option(0, "keep the k most likely tokens (0: off)", request=True)
    top_p: float = option(1.0, "keep the smallest set of tokens holding this much probability (1: off)",
                          request=True)
    min_p: float = option(0.0, "drop tokens less likely than this times the most likely one (0: off)",
                          request=True)
    seed: int | None = option(None, "sampling seed: the token at each position is drawn with noise keyed by "
                              "(seed, position), so the same seed and settings give the same text whatever the "
                              "method, K, batch or earlier traffic", kind=int, request=True)
    max_new_tokens: int = option(128, "tokens to generate at most", request="max_tokens")
    stop: tuple[str, ...] = option((), "stop when this text appears (repeatable)", many="repeat", request=True)
    ignore_eos: bool = option(False, "generate max-new-tokens tokens even past the end-of-text token",
                              request=True)
    logit_bias: tuple[tuple[int, float], ...] = option(
        (), "ID=BIAS: add BIAS to token ID's logit (OpenAI's -100..100: -100 bans the token, 100 forces it; "
        "repeatable)", kind=lambda text: parse_bias(text), many="repeat", metavar="ID=BIAS")
    presence_penalty: float = option(0.0, "subtract this from the logit of every token the output holds "
                                     "(OpenAI's, -2..2)", request=True)
    frequency_penalty: float = option(0.0, "subtract this times a token's count in the output (OpenAI's, -2..2)",
                                      request=True)
    repetition_penalty: float = option(1.0, f"divide the positive logits of the last {REPEAT_WINDOW} context "
                                       "tokens by this and multiply their negative ones (llama.cpp's repeat "
                                       "penalty; 1: off)", request=True)
    logprobs: int | None = option(None, f"report each generated token's log-probability and the N most likely "
                                  f"alternatives (0..{MAX_LOGPROBS})", kind=int)
    prompt_logprobs: int | None = option(None, "report each prompt token's log-probability and the N most "
                                         f"likely alternatives (0..{MAX_LOGPROBS}); allows max-new-tokens 0",
                                         kind=int)
    grammar: Grammar | None = option(None, "what the output must match: a speclm.Grammar (a JSON schema, any "
                                     "JSON object, a regex, a Lark grammar); the commands' --json-schema and "
                                     "the server's response_format set it", cli=False)
    # not a user's setting: (token, text) pairs whose tokens read as that text in the output's text, their ids
    # unchanged; the server marks a vocabulary's tool-call tags so calls are read by token (server/call_reading.py)
    shown_as: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if self.stop is None:
            object.__setattr__(self, "stop", ())
        elif isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        else:
            raise InvalidRequestError(f"stop must be a string or a list of strings, got {self.stop!r}")
        object.__setattr__(self, "logit_bias", normalised_bias(self.logit_bias))
        object.__setattr__(self, "grammar", Grammar.of(self.grammar))
        object.__setattr__(self, "shown_as", tuple((int(t), str(text)) for t, text in self.shown_as))
        validate_sampling(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processed(self) -> bool:
        """Whether any logit processor changes the raw logits (`Processors`)."""
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 \
            or self.repetition_penalty != 1.0


def validate_sampling(p: SamplingParams) -> None:
    """Raise InvalidRequestError naming the bad field and its valid range."""
    if not isinstance(p.temperature, (int, float)) or not math.isfinite(p.temperature) or p.temperature < 0:
        raise InvalidRequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {p.temperature!r}")
    if not is_int(p.top_k) or p.top_k < 0:
        raise InvalidRequestError(f"top_k must be an integer >= 0 (0 = disabled), got {p.top_k!r}")
    if not isinstance(p.top_p, (int, float)) or not (0.0 < p.top_p <= 1.0):
        raise InvalidRequestError(f"top_p must be in (0, 1] (1 = disabled), got {p.top_p!r}")
    if not isinstance(p.min_p, (int, float)) or not (0.0 <= p.min_p < 1.0):
        raise InvalidRequestError(f"min_p must be in [0, 1) (0 = disabled), got {p.min_p!r}")
    least = 0 if p.prompt_logprobs is not None else 1  # scoring a prompt generates nothing
    if not is_int(p.max_new_tokens) or p.max_new_tokens < least:
        raise InvalidRequestError(f"max_new_tokens must be an integer >= {least}"
                                  f"{'' if least else ' (0 only to score the prompt: prompt_logprobs)'}, "
                                  f"got {p.max_new_tokens!r}")
    if p.seed is not None and (not is_int(p.seed) or p.seed < 0):
        raise InvalidRequestError(f"seed must be a non-negative integer, got {p.seed!r}")
    if any(not isinstance(s, str) or s == "" for s in p.stop):
        raise InvalidRequestError(f"stop strings must be non-empty strings, got {p.stop!r}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not _number(value) or not -2.0 <= value <= 2.0:
            raise InvalidRequestError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
    if not _number(p.repetition_penalty) or p.repetition_penalty <= 0:
        raise InvalidRequestError(f"repetition_penalty must be a number > 0 (1 = off), got {p.repetition_penalty!r}")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(p, name)
        if value is not None and (not is_int(value) or not 0 <= value <= MAX_LOGPROBS):
            raise InvalidRequestError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] (alternatives per "
                                      f"token), got {value!r}")
    if p.grammar is not None and p.ignore_eos:
        raise InvalidRequestError("ignore_eos cannot be combined with a grammar: the grammar ends the output "
                                  "with the end-of-text token once it is complete")


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_bias(text: str) -> tuple[int, float]:
    """ID=BIAS on the command line."""
    token, sep, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise InvalidRequestError(f"logit bias must be ID=BIAS (a token id and a number), got {text!r}") from None


def normalised_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs, from a mapping ({id: bias}, ids may be
    decimal strings as JSON sends them: "12", never " 12 ", "012" or other digits than
    ASCII's) or pairs; InvalidRequestError naming the bad entry."""
    if bias is None:
        return ()
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        items = list(items)
    except TypeError:
        raise InvalidRequestError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    out: dict[int, float] = {}
    for item in items:
        token, value = item if isinstance(item, (tuple, list)) and len(item) == 2 else (item, None)
        if isinstance(token, str):  # JSON's keys: a token id written as OpenAI writes it, "12"
            if not _TOKEN_ID.fullmatch(token):
                shown = repr(token) if len(token) <= 40 else repr(token[:40]) + "..."
                raise InvalidRequestError(f"logit_bias keys must be token ids written in decimal digits, without "
                                          f"signs, spaces or leading zeros (\"12\"), got {shown}")
            token = int(token)
        if not is_int(token) or token < 0:
            raise InvalidRequestError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if not _number(value) or not -BIAS_LIMIT <= value <= BIAS_LIMIT:
            raise InvalidRequestError(f"logit_bias values must be numbers in [-100, 100], got {value!r} "
                                      f"for token {token}")
        out[token] = float(value)
    return tuple(sorted(out.items()))


_TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,17}", re.ASCII)  # ASCII digits only (not "١٢"), well inside int()'s limits


def is_int(x: object) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


class Processors:
    """One request's logit processors, in a fixed order: logit_bias, the repetition
    penalty, then the presence and frequency penalties (docs/design.md#processed-distributions).

    Contract: `process(rows, draft)` returns rows[i] processed as plain decoding
    processes the logits after the output so far plus draft[:i]; `advance(tokens)`
    appends tokens the request emitted. Draft tokens never enter the state, so a
    rejected draft needs no rollback."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int]):
        self.params = params
        self.counts: dict[int, int] = {}  # output token -> how often the output holds it
        self.recent: list[int] = list(prompt_ids[-REPEAT_WINDOW:])  # the context's last tokens
        ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
        values = np.array([b for _, b in params.logit_bias], dtype=np.float64)
        self.banned = ids[values <= -BIAS_LIMIT]
        self.forced = ids[values >= BIAS_LIMIT]
        inside = (values > -BIAS_LIMIT) & (values < BIAS_LIMIT)
        self.bias_ids, self.bias_values = ids[inside], values[inside]

    def advance(self, tokens: list[int]) -> None:
        for t in tokens:
            self.counts[t] = self.counts.get(t, 0) + 1
        self.recent = (self.recent + list(tokens))[-REPEAT_WINDOW:]

    def process(self, rows: np.ndarray, draft: list[int]) -> np.ndarray:
        """float64 copy of rows (one per block position, len(rows) <= len(draft) + 1)
        with row i processed given the prefix output + draft[:i]."""
        out = np.array(rows, dtype=np.float64)
        p, counts = self.params, dict(self.counts)
        for i, row in enumerate(out):
            if i:
                counts[draft[i - 1]] = counts.get(draft[i - 1], 0) + 1
            self._bias(row)
            if p.repetition_penalty != 1.0:
                window = (self.recent + list(draft[:i]))[-REPEAT_WINDOW:]
                seen = np.unique(np.asarray(window, dtype=np.int64))
                vals = row[seen]
                row[seen] = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if counts and (p.presence_penalty or p.frequency_penalty):
                ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                n = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
                row[ids] -= p.frequency_penalty * n + p.presence_penalty
        return out

    def _bias(self, row: np.ndarray) -> None:
        if self.bias_ids.size:
            row[self.bias_ids] += self.bias_values
        if self.banned.size:
            row[self.banned] = -np.inf
        if self.forced.size:
            keep = row[self.forced]
            row[:] = -np.inf
            row[self.forced] = keep


def empty_row(row: np.ndarray) -> bool:
    """Whether a processed row leaves no token (every logit -inf, or not a number): the
    request's processors and grammar together exclude the whole vocabulary there."""
    top = np.max(row)
    return bool(np.isnan(top) or np.isneginf(top))


def first_row_problem(params: SamplingParams, vocab_size: int, allowed: np.ndarray | None = None,
                      grammar: str = "the grammar") -> str | None:
    """Why the request's first processed row would leave no token, decided before it runs
    (None: some token is left): logit_bias forcing (+100) only tokens `allowed` (the
    grammar's first mask; None: no grammar) excludes, or banning (-100) all it allows.
    The penalties cannot empty a row of finite logits, and the output has no tokens yet."""
    forced = [t for t, b in params.logit_bias if b >= BIAS_LIMIT and t < vocab_size]  # others: a 400 of their own
    banned = {t for t, b in params.logit_bias if b <= -BIAS_LIMIT and t < vocab_size}
    if forced:
        if allowed is None or any(allowed[t] for t in forced):
            return None
        shown = ", ".join(map(str, forced[:8])) + (", ..." if len(forced) > 8 else "")
        return (f"logit_bias forces (+100) only token{'s' if len(forced) > 1 else ''} {shown}, which {grammar} "
                "does not allow as the first token: no token is left to sample; drop the +100 biases or the grammar")
    if not banned:
        return None
    if allowed is None:
        if len(banned) < vocab_size:
            return None
        return (f"logit_bias bans (-100) every token of the vocabulary ({vocab_size}): no token is left to sample; "
                "drop some of the -100 biases")
    allowed_ids = np.flatnonzero(allowed[:vocab_size])
    if any(int(t) not in banned for t in allowed_ids):
        return None
    return (f"logit_bias bans (-100) every token {grammar} allows as the first token ({allowed_ids.size}): "
            "no token is left to sample; drop those -100 biases or change the grammar")


def softmax(logits: np.ndarray) -> np.ndarray:
    """float64 softmax of a 1-D logit vector (logits of +inf, which only an extreme
    repetition_penalty makes, share the mass: softmax's limit)."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max()
    if np.isposinf(top):
        x = (x == top).astype(np.float64)
        return x / x.sum()
    x = x - top
    np.exp(x, out=x)
    x /= x.sum()
    return x


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed next-token distribution (float64, sums to 1).

    Greedy returns the one-hot vector at argmax (first index on ties, the same
    rule `np.argmax` uses everywhere in speclm).
    """
    logits = np.asarray(logits)
    if params.greedy:
        p = np.zeros(logits.shape[-1], dtype=np.float64)
        p[int(np.argmax(logits))] = 1.0
        return p
    p = softmax(logits.astype(np.float64) / params.temperature)
    if params.top_k and params.top_k < p.size:
        _keep_top_k(p, params.top_k)
    if params.top_p < 1.0:
        _keep_top_p(p, params.top_p)
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
    p /= p.sum()
    return p


def _keep_top_k(p: np.ndarray, k: int) -> None:
    """Zero all but the k most likely tokens (ties at the boundary: lower ids win).
    O(vocabulary): the k-th largest value by partition, not a sort (docs/results.md#t1)."""
    kth = np.partition(p, p.size - k)[p.size - k]
    above = p > kth
    ties = np.flatnonzero(p == kth)[:k - int(np.count_nonzero(above))]
    above[ties] = True
    p[~above] = 0.0


def _keep_top_p(p: np.ndarray, top_p: float) -> None:
    """Keep the smallest most-likely set whose mass reaches top_p (in place; ties in
    probability: lower ids first). Sorted among the tokens above a threshold whose
    mass already reaches top_p (the set lies among them, since it takes the most
    likely first), falling back to lower thresholds and then the whole vocabulary."""
    total = p.sum()
    need = top_p * total * (1 - 1e-12)  # tolerate float rounding in the running sum
    top = p.max()
    for floor in (top * 1e-3, top * 1e-6, 0.0):
        cand = np.flatnonzero(p >= floor) if floor > 0 else np.arange(p.size)
        if floor == 0.0 or p[cand].sum() >= need:
            break
    order = cand[np.lexsort((cand, -p[cand]))]
    cum = np.cumsum(p[order])
    cut = int(np.searchsorted(cum, need, side="left")) + 1
    keep = np.zeros(p.size, dtype=bool)
    keep[order[:cut]] = True
    p[~keep] = 0.0


def token_logprob(row: np.ndarray, token: int, top: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """`token`'s log-probability under the raw logits `row` and the `top` most likely
    tokens there (ties: lower ids first); piece(id): the bytes a token decodes to."""
    x = np.asarray(row, dtype=np.float64)
    m = x.max()
    logz = m + math.log(np.exp(x - m).sum())
    best: tuple[tuple[int, float, bytes], ...] = ()
    if top:
        cand = np.argpartition(-x, top - 1)[:top] if top < x.size else np.arange(x.size)
        order = cand[np.lexsort((cand, -x[cand]))]
        best = tuple((int(t), float(x[t] - logz), piece(int(t))) for t in order)
    return TokenLogprob(int(token), float(x[token] - logz), piece(int(token)), best)


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from distribution p by inverse CDF (one uniform)."""
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), p.size - 1))


def position_uniforms(seed: int, position: int, size: int) -> np.ndarray:
    """u_v ~ U[0, 1) for the tokens v < size, i.i.d., a function of (seed, position, v)
    alone: a longer draw starts with the shorter one (a draft vocabulary of another
    size sees the same noise per token), and every position has its own stream."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, position]))).random(size)


def keyed_sample(p: np.ndarray, seed: int, position: int) -> int:
    """Gumbel-max: argmax_v log p_v + g_v with g_v = -log E_v, E_v = -log(1 - u_v) ~ Exp(1)
    i.i.d. (u: position_uniforms), i.e. argmin_v E_v / p_v: an exact sample of p that
    depends on (p, seed, position) alone.

    Exact and cheap: -log(1 - u) >= u, so u_v / p_v bounds E_v / p_v from below; only
    the tokens whose bound is under the most likely token's exact E / p can win, and
    only theirs are computed (no logarithm over the whole vocabulary)."""
    u = position_uniforms(seed, position, p.size)
    top = int(np.argmax(p))
    best = -np.log1p(-u[top]) / p[top]
    with np.errstate(divide="ignore", invalid="ignore"):
        candidates = np.flatnonzero(u / p < best)  # p_v = 0: inf (u > 0) or nan (u = 0): never a candidate
    if candidates.size == 0:
        return top
    exact = -np.log1p(-u[candidates]) / p[candidates]
    return int(candidates[np.argmin(exact)])


def draw(p: np.ndarray, params: SamplingParams, rng: np.random.Generator, position: int) -> int:
    """One token from p for the token at `position` (its index in the context): keyed
    by (params.seed, position) when the request has a seed, else from rng."""
    if params.seed is not None:
        return keyed_sample(p, params.seed, position)
    return sample(p, rng)
