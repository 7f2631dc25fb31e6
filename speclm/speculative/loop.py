"""The speculative decoding loop: draft → score → accept → resample → iterate.

Each stage is one function below (docs/design.md). Invariant between rounds:
the target's KV holds `context[:-1]`; the last context token is "pending" and
is scored as the first row of the next block, so every round is exactly one
target forward. The first round's block may carry the prompt's last chunk in
front of the pending token (`Round.lead`): the prompt and the first token then
cost one forward, as in plain llama.cpp. With no proposer (K = 0) the same loop
is plain autoregressive decoding.

The round protocol: `Generation.plan()` runs stage 1 and returns a `Round`
(the block to score and what the later stages need); whoever drives the
request scores every planned block in one forward (`score`, stage 2) and
hands each request its rows through `Generation.complete(round, p, ...)`
(stages 3–5). One driver does this for one request or many
(speculative/steps.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend
from ..constraints import GrammarMask, model_label
from ..costs import clock_ms
from ..errors import InvalidRequestError
from ..metrics import GenerationResult, RoundRecord, TokenLogprob, summarize
from ..sampling import (Processors, SamplingParams, empty_row, first_row_problem, keyed_sample, sample,
                        target_probs, token_logprob)
from ..stops import StopChecker
from .controller import Controller
from .grammar_draft import shape_draft
from .proposers.base import Draft, Proposer
from .proposers.prediction_counts import prediction_counts


# ---- 1. draft ------------------------------------------------------------
def draft(proposer: Proposer | None, context: list[int], k: int,
          params: SamplingParams, rng: np.random.Generator) -> Draft:
    """Up to k draft tokens with the exact q each was drawn from."""
    if proposer is None or k <= 0:
        return Draft()
    d = proposer.propose(context, k, params, rng)
    d.truncate(k)
    return d


# ---- 2. score ------------------------------------------------------------
def score(target: Backend, blocks: Sequence[tuple[Generation, list[int], Round | None]]
          ) -> list[list[np.ndarray] | np.ndarray | None]:
    """ONE target forward over every block: (request, its block, its Round) for a
    round's [lead.., pending, d1..dK], or (request, prompt chunk, None) for a prefill
    chunk. Per round, the processed target distributions p_1..p_{K+1}
    (`Generation.distributions`: row i processed with its own prefix; that processed p
    IS the target distribution; a lead's rows, unless the request scores its prompt
    (`Round.lead_rows` then), and the rows the grammar leaves one token (`Round.certain`)
    are not computed); per chunk, its rows'
    raw logits when the request scores its prompt, else None (its last row is computed,
    unread)."""
    wants = [(len(tokens) - (0 if gen.scores_prompt else len(rnd.lead))) if rnd is not None else
             None if gen.scores_prompt else 1 for gen, tokens, rnd in blocks]
    skips = [rnd.certain if rnd is not None else () for _, _, rnd in blocks]  # one-hot whatever the logits
    logits = target.score_batch([(gen.seq, tokens) for gen, tokens, _ in blocks], wants, skips)
    out = []
    for rows, want, (gen, tokens, rnd) in zip(logits, wants, blocks):
        if rnd is None:
            out.append(rows if want is None else None)
            continue
        if gen.scores_prompt and rnd.lead:  # the prompt's rows go to its logprobs (Generation.complete)
            rnd.lead_rows, rows = rows[:len(rnd.lead)], rows[len(rnd.lead):]
        out.append(gen.distributions(rows, rnd.draft.tokens))
    return out


# ---- 3. accept -----------------------------------------------------------
def accept(d: Draft, p: list[np.ndarray], params: SamplingParams,
           rng: np.random.Generator, at: int = 0) -> int:
    """Length of the accepted prefix: d_i is kept with prob min(1, p_i(d_i)/q_i(d_i))
    (greedy: iff d_i is the argmax of p_i). Seeded (params.seed): iff d_i is the
    target's own keyed sample at its position at + i, the token plain decoding with
    that seed emits there (sampling.keyed_sample; docs/design.md#seeded-sampling)."""
    for i, tok in enumerate(d.tokens):
        p_tok = p[i][tok] if tok < p[i].size else 0.0
        if params.greedy:
            if tok != int(np.argmax(p[i])):
                return i
            continue
        if params.seed is not None:
            if tok != keyed_sample(p[i], params.seed, at + i):
                return i
            continue
        q_tok = 1.0 if d.q[i] is None else float(d.q[i][tok])
        if not rng.random() * q_tok < p_tok:
            return i
    return len(d.tokens)


# ---- 4. resample ---------------------------------------------------------
def resample(p: np.ndarray, q: np.ndarray | None, rejected: int | None,
             params: SamplingParams, rng: np.random.Generator, at: int = 0) -> int:
    """The round's last token, at position `at`. After a rejection of `rejected`
    drawn from q: a sample of norm(max(0, p - q)); after a full acceptance
    (rejected None): a bonus sample of p. Seeded: the keyed sample of p at `at`
    either way (it differs from a rejected draft token by construction)."""
    if params.greedy:
        return int(np.argmax(p))
    if params.seed is not None:
        return keyed_sample(p, params.seed, at)
    if rejected is None:
        return sample(p, rng)
    if q is None:  # deterministic proposer: q is one-hot at the rejected token
        residual = p.copy()
        residual[rejected] = 0.0
    else:
        residual = np.maximum(p - _fit(q, p.size), 0.0)
    mass = residual.sum()
    # mass == 0 only when p == q, where a rejection has probability zero.
    return sample(residual / mass if mass > 0 else p, rng)


def _fit(q: np.ndarray, size: int) -> np.ndarray:
    """q over the target's vocabulary (a draft vocab may be padded differently)."""
    if q.size == size:
        return q
    return q[:size] if q.size > size else np.pad(q, (0, size - q.size))


# ---- 5. iterate ----------------------------------------------------------
def iterate(target: Backend, seq: int, context: list[int], d: Draft,
            n_accepted: int, last_token: int, processors: Sequence[Processors | GrammarMask] = ()) -> None:
    """Advance to the accepted state: roll the target KV back to context[:-1]
    + pending + accepted drafts (O(1)), append the new tokens to context and
    advance the request's row processors over them."""
    target.rollback(seq, len(context) + n_accepted)
    new = [*d.tokens[:n_accepted], last_token]
    context.extend(new)
    for processor in processors:
        processor.advance(new)


# ---- the round protocol --------------------------------------------------------
@dataclass
class Round:
    """One planned round (stage 1 done): the block the target must score in one
    forward, and what stages 3–5 need back."""

    draft: Draft
    block: list[int]  # [*lead, pending, d1..dK]: the rows of this round's forward
    note: str | None = None  # why this K (the controller's word, for the trace)
    info: dict | None = None  # the proposer's facts about this draft, for the trace
    draft_ms: float = 0.0
    forced_at: tuple[int, ...] = ()  # the positions in the draft of the tokens the grammar forced
    # A round the step may re-cut (`Generation.recut`; speculative/steps.py even_blocks): the
    # draft before the controller's cut, E[tokens emitted] verifying m of its tokens
    # (m = 0..len(full)), and the most draft tokens this request may verify. None: as planned.
    full: Draft | None = None
    expected: tuple[float, ...] = ()
    room: int = 0
    lead: tuple[int, ...] = ()  # the prompt's last chunk, prefilled by this round's forward (first round only)
    certain: tuple[int, ...] = ()  # rows (after the lead) where the grammar allows one token: logits not needed
    lead_rows: np.ndarray | None = None  # the lead's raw logits, scored where the request scores its prompt


class Generation:
    """One request's state across rounds. Owns its KV sequence and its
    proposer; `close()` releases both (idempotent).

    A driver (speculative/steps.py) takes it through `begin()`, prefills
    `prefill_left` (then `prefilled(n)`), and runs each round as `plan()` →
    its share of one scored forward → `complete(round, p, ...)`.

    `threads` (None: the backend default) sets the target's compute threads
    for this request's forwards (SSD gives the other cores to its speculator).
    `controller` picks each round's K (0 = a plain decoding step) and the
    prefix of each draft it keeps (speculative/controller.py; None: a fixed K).

    `prefix_cache` (a PrefixCache), if given, fills the new sequence with the
    longest KV copy of an earlier request in `cache_scope` that shares the
    prompt's start (only the rest is prefilled), and `close()` adds ours to it.
    """

    def __init__(self, target: Backend, proposer: Proposer | None, prompt_ids: list[int],
                 params: SamplingParams, k: int, method: str = "sd",
                 on_text: Callable[[str], None] | None = None,
                 eos_ids: frozenset[int] | None = None, controller=None, threads: int | None = None,
                 prefix_cache=None, cache_scope: str | None = None, prediction: list[int] | None = None):
        check_request(target, prompt_ids, k, params)
        self.prefix_cache, self.cache_scope = prefix_cache, cache_scope
        self.threads = threads  # target compute threads for this request (None: the backend's)
        self.target, self.proposer, self.params, self.k = target, proposer, params, k
        self.method, self.on_text = method, on_text
        self.controller: Controller = controller if controller is not None else Controller()
        self.prompt_ids = list(prompt_ids)
        self.context = list(prompt_ids)
        self.rng = np.random.default_rng(params.seed)
        self.grammar = GrammarMask(params.grammar, target) if params.grammar is not None else None
        # the row processors in order (each: process(rows, draft) and advance(tokens)); the mask goes last
        self.processors: list[Processors | GrammarMask] = [
            *([Processors(params, prompt_ids)] if params.processed else []),
            *([self.grammar] if self.grammar is not None else [])]
        if params.logit_bias:  # a bias that leaves no first token is the request's error, not a stop
            allowed = self.grammar.allowed() if self.grammar is not None else None
            if problem := first_row_problem(params, target.vocab_size, allowed):
                raise InvalidRequestError(problem)
        self.prediction = prediction  # the client's expected output (token ids), a draft source
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob] | None = None if params.prompt_logprobs is None else \
            [TokenLogprob(prompt_ids[0], None, target.token_bytes(prompt_ids[0]))]
        self._raw_rows: np.ndarray | None = None  # the last scored round's raw logits (logprobs asked)
        self.eos_logprob: TokenLogprob | None = None  # the end-of-sequence token it ended on (logprobs asked)
        self.stops = StopChecker(target, params, eos_ids)
        self.rounds: list[RoundRecord] = []
        self.seq: int | None = None
        self.t_start = clock_ms()
        self.t_end: float | None = None
        self.prefill_ms = 0.0
        self.ttft_ms: float | None = None
        self.kv_len = 0
        self.cached_tokens = 0  # prompt tokens restored from the prefix cache, not prefilled
        self.t_begin = self.t_start

    @property
    def finished(self) -> bool:
        return self.stops.finished is not None

    def begin(self, live: Sequence[int] = ()) -> None:
        """Take a KV sequence and let the proposer start; the prompt is not yet in the KV.
        live: running sequences of our cache scope whose KV may hold our prompt's start."""
        self.t_begin = clock_ms()  # a scheduler may start us later than t_start
        self.seq = self.target.new_sequence()
        self.kv_len = 0  # prompt tokens (context[:-1] at the start) in the KV so far
        self.prompt_end = len(self.context) - 1  # where prefill stops: later tokens enter the KV by rounds
        if self.prefix_cache is not None and self.prompt_logprobs is None:  # a scored prompt computes every row
            self.kv_len = self.cached_tokens = self.prefix_cache.restore(
                self.cache_scope, self.target, self.seq, self.reusable_prompt, live)
            if self.cached_tokens and not self.prefill_left:  # the whole prompt restored: that was its prefill
                self.prefill_ms = clock_ms() - self.t_begin
        if self.proposer is not None and self.k > 0:
            self.proposer.attach(self.target, self.seq)
            self.proposer.begin(self.context, self.params)

    @property
    def reusable_prompt(self) -> list[int]:
        """The prompt tokens a KV copy may fill: all but the pending token (the first
        round scores it), and but the last prompt row too where the target keeps hidden
        states (a proposer reading them needs the prompt's own forward)."""
        return self.context[:max(0, len(self.prompt_ids) - (2 if self.target.keeps_hidden else 1))]

    @property
    def prefill_left(self) -> list[int]:
        """The prompt tokens still to prefill (all but the pending last one)."""
        return self.context[self.kv_len:self.prompt_end] if self.seq is not None else []

    def prefilled(self, n: int, rows: np.ndarray | None = None) -> None:
        """A scheduler prefilled the next n tokens of prefill_left into our sequence
        (rows: their raw logits, when the request scores its prompt)."""
        if self.prompt_logprobs is not None and rows is not None:
            nxt = self.context[self.kv_len + 1:self.kv_len + n + 1]
            self.prompt_logprobs += [token_logprob(row, t, self.params.prompt_logprobs, self.target.token_bytes)
                                     for row, t in zip(rows, nxt)]
        self.kv_len += n
        if not self.prefill_left:
            self.prefill_ms = clock_ms() - self.t_begin

    @property
    def scores_prompt(self) -> bool:
        """Does the request want its prompt's rows (prompt logprobs: echo)?"""
        return self.prompt_logprobs is not None

    @property
    def folds_prompt(self) -> bool:
        """May the prompt's last chunk ride in front of the first round's block
        (`plan(lead)`)? Not where nothing is generated (max_new_tokens 0: the prompt is
        only scored, no round follows) or the target keeps hidden states (llama.cpp would
        run the output head over every row). A scored prompt folds too, so that a prompt
        scored with one token generated (lm-eval's `max_tokens: 1`) is one forward of its
        tokens, as a client computing it directly does."""
        return self.stops.remaining > 0 and not self.target.keeps_hidden

    @property
    def noise_position(self) -> int:
        """The position of the round's first new token (p_1's), whose index in the
        context it will be: seeded sampling keys its noise by it, so a token's noise
        is its position's, however the rounds fell (docs/design.md#seeded-sampling)."""
        return len(self.context)

    def plan(self, lead: Sequence[int] = ()) -> Round | None:
        """Stage 1 of the next round: the controller chooses K, the proposer drafts,
        the controller keeps the prefix that pays. None: the context is full and the
        request has finished. lead: all of `prefill_left` (folds_prompt), scored in
        front of the block by the same forward; the controller prices the block alone."""
        if self.finished:
            return None
        room = self.target.n_ctx - len(self.context)
        if room <= 0 or self.stops.remaining <= 0:  # max_new_tokens 0: the prompt was only scored
            self._emit(self.stops.finish_length())
            self._done()
            return None
        k_max = max(0, min(self.k, self.stops.remaining - 1, room - 1))
        if lead and self.scores_prompt:  # the prompt's rows with no drafts beside them, as plain decoding's
            k_max = 0
        self.controller.learn(self.context)
        k_r, note = self.controller.choose(k_max)
        t0 = clock_ms()
        d = draft(self.proposer, self.context, k_r, self.params, self.rng)
        info = self.proposer.round_info() if self.proposer is not None and k_r > 0 else None
        forced_at: list[int] = []
        if self.grammar is not None:  # clip to the grammar, draft what it forces (certain), go on after it
            extend = None if self.proposer is None or k_r <= 0 else \
                (lambda drafted, n: self.proposer.extend(self.context, drafted, n))
            forced_at = shape_draft(self.grammar, d, k_max, self.params, extend)
        full = None
        if d.tokens:  # the controller prices the whole block, forced tokens as certain ones
            kept = self.controller.keep(d, len(self.context))
            if self._recuttable(d) and not lead:
                full = Draft(list(d.tokens), list(d.q), list(d.confidence))
            if d.confidence is not None:  # a per-position cut: the trace says what was kept and why
                info = {**(info or {}), "drafted": len(d), "kept": kept, "choice": self.controller.prefix_note}
            d.truncate(kept)
            forced_at = [i for i in forced_at if i < kept]
        elif self._recuttable(d) and not lead:  # nothing drafted: the step may still pad the block
            full = Draft([], [], [])
        # rows whose masked p is one-hot need no logits (but logprobs read the raw rows)
        certain = self.grammar.certain_rows(d.tokens, forced_at) if forced_at and self.logprobs is None else ()
        rnd = Round(d, [*lead, self.context[-1], *d.tokens], note, info, clock_ms() - t0, tuple(forced_at),
                    lead=tuple(lead), certain=certain)
        if full is not None:
            rnd.full, rnd.expected, rnd.room = full, tuple(self.controller.prefix_expected or (1.0,)), k_max
        return rnd

    def _recuttable(self, d: Draft) -> bool:
        """May the step re-cut this draft and pad it (`recut`)? Deterministic tokens with
        estimates the controller priced (a controller that prices prefixes: a fixed K keeps
        its blocks, empty ones too), from a proposer that no verified draft teaches, and no
        grammar (a padding token may be one it forbids)."""
        if self.grammar is not None or self.proposer is None or not self.proposer.recuttable \
                or not self.controller.prices_prefixes:
            return False
        return not d.tokens or (d.confidence is not None and all(q is None for q in d.q)
                                and self.controller.prefix_expected is not None
                                and len(self.controller.prefix_expected) == len(d) + 1)

    def recut(self, rnd: Round, m: int) -> Round:
        """The round verifying m draft tokens instead: the first m of the draft before the
        controller's cut, then its last token (or the context's) repeated up to m: a
        deterministic draft like any other, so the output is the target's whatever is
        verified (docs/design.md#even-blocks). The controller is told (Controller.recut)."""
        d = Draft(rnd.full.tokens[:m], rnd.full.q[:m], rnd.full.confidence[:m])
        n_pad = m - len(d)
        d.tokens += [rnd.full.tokens[-1] if rnd.full.tokens else self.context[-1]] * n_pad
        d.q += [None] * n_pad
        d.confidence += [0.0] * n_pad
        self.controller.recut(min(m, len(rnd.full)))
        info = {**(rnd.info or {}), "drafted": len(rnd.full), "kept": m, "padded": n_pad,
                "choice": "the step's even block"}
        return Round(d, [*rnd.lead, self.context[-1], *d.tokens], rnd.note, info, rnd.draft_ms, rnd.forced_at,
                     rnd.full, rnd.expected, rnd.room, rnd.lead)

    def distributions(self, rows: np.ndarray, draft: list[int]) -> list[np.ndarray | None]:
        """Stage 2's processing of this request's scored rows: row i processed with
        the prefix context + draft[:i] (the request's processors, the grammar's mask
        last), then its sampling applied: p_1..p_{K+1}. A row the processors leave no
        token in is None (`complete` ends the request there: docs/design.md#processed-distributions).
        Keeps the raw rows for `complete` when logprobs are asked."""
        if self.logprobs is not None:
            self._raw_rows = rows
        if not self.processors:
            return [target_probs(row, self.params) for row in rows]
        for processor in self.processors:
            rows = processor.process(rows, draft)
        return [None if empty_row(row) else target_probs(row, self.params) for row in rows]

    def complete(self, rnd: Round, p: list[np.ndarray | None], verify_ms: float,
                 batch_passes: list[int] | None = None) -> bool:
        """Stages 3–5 of a planned round from its scored distributions p_1..p_{K+1};
        True once the generation has finished. A row with no token left (None) ends the
        request there with finish_reason "content_filter", the tokens before it accepted
        or rejected as usual. batch_passes: the rows of each pass of
        the whole forward when other requests shared it (verify_ms is its time)."""
        d, note, info, draft_ms = rnd.draft, rnd.note, rnd.info, rnd.draft_ms
        if rnd.lead:
            self.prefilled(len(rnd.lead), rnd.lead_rows)
        t2 = clock_ms()
        at = self.noise_position
        empty = next((i for i, row in enumerate(p) if row is None), None)
        if empty is not None:  # no token is left at draft position `empty`: the draft is verified up to it
            d.truncate(empty)
        a = accept(d, p, self.params, self.rng, at)
        if a == empty:  # every token before the empty row accepted: plain decoding stops there too
            last = None
            self.target.rollback(self.seq, len(self.context) + a)
            self.context.extend(d.tokens[:a])
            for processor in self.processors:
                processor.advance(d.tokens[:a])
        else:
            last = resample(p[a], d.q[a] if a < len(d) else None,
                            d.tokens[a] if a < len(d) else None, self.params, self.rng, at + a)
            iterate(self.target, self.seq, self.context, d, a, last, self.processors)
            if self.proposer is not None and self.k > 0:
                self.proposer.verified(d, p[:a + 1], a)
        n_before = len(self.stops.token_ids)
        for tok in (*d.tokens[:a], *([] if last is None else [last])):
            self._emit(self.stops.push(tok))
            if self.finished:
                break
        if last is None:
            self._emit(self.stops.finish_filtered())
        delivered = len(self.stops.token_ids) - n_before  # EOS or a stop may cut the round short
        if rnd.forced_at:  # the round's facts: forced drafts, taken
            taken = sum(i < min(a, delivered) for i in rnd.forced_at)
            self.grammar.forced_emitted += taken
            info = {**(info or {}), "forced": len(rnd.forced_at), "forced_accepted": taken}
        if self.logprobs is not None:
            raw = self._raw_rows
            self.logprobs += [token_logprob(raw[i], t, self.params.logprobs, self.target.token_bytes)
                              for i, t in enumerate(self.stops.token_ids[n_before:])]
            if self.stops.eos_token is not None:  # the row after the delivered tokens chose it
                self.eos_logprob = token_logprob(raw[delivered], self.stops.eos_token, self.params.logprobs,
                                                 self.target.token_bytes)
        t3 = clock_ms()
        if self.ttft_ms is None:
            self.ttft_ms = t3 - self.t_start
        produced = a + (last is not None)  # the accepted tokens and the resampled one, if any
        record = RoundRecord(proposed=len(d), accepted=min(a, delivered), discarded=produced - delivered,
                             draft_ms=draft_ms, verify_ms=verify_ms, other_ms=t3 - t2, note=note,
                             info=info, batch_passes=batch_passes, at_ms=t3 - self.t_start,
                             prompt_rows=len(rnd.lead))
        self.rounds.append(record)
        self.controller.observe(record)
        return self._done() if self.finished else False

    def _done(self) -> bool:
        self.t_end = self.t_end or clock_ms()
        self.close()
        return True

    def _emit(self, text: str) -> None:
        if text and self.on_text is not None:
            self.on_text(text)

    def close(self) -> None:
        """Free the KV sequence and the proposer; the result stays readable."""
        if self.seq is not None:
            if self.prefix_cache is not None:
                self.prefix_cache.keep(self.cache_scope, self.target, self.seq)
            self.target.free(self.seq)
            self.seq = None
        if self.proposer is not None:
            self.proposer.update(self.context)
            self.proposer.close()
        self.controller.learn(self.context)

    def result(self) -> GenerationResult:
        end = self.t_end or clock_ms()
        wall_ms = end - self.t_start
        s = self.stops
        return GenerationResult(
            text=s.text, token_ids=list(s.token_ids), finish_reason=s.finished or "cancelled",
            prompt_tokens=len(self.prompt_ids), method=self.method, k=self.k, rounds=list(self.rounds),
            summary=summarize(self.rounds, len(s.token_ids), wall_ms, self.ttft_ms, self.prefill_ms,
                              self.t_begin - self.t_start),
            target=self.target.name, draft=None if self.proposer is None else self.proposer.name,
            cached_prompt_tokens=self.cached_tokens, logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
            eos_logprob=self.eos_logprob,
            prediction=None if self.prediction is None else prediction_counts(self.prediction, s.token_ids),
            forced_tokens=None if self.grammar is None else self.grammar.forced_emitted)


def context_problem(n_ctx: int, prompt_tokens: int, max_new_tokens: int | None = None,
                    name: str = "max_new_tokens") -> tuple[str, str] | None:
    """Why a prompt (with up to max_new_tokens more) does not fit a context of n_ctx
    tokens, and what to change ("prompt" or `name`, the caller's word for
    max_new_tokens); None when it fits. Every surface checks the fit here."""
    if prompt_tokens >= n_ctx:
        return f"the prompt is {prompt_tokens} tokens but the context holds {n_ctx}", "prompt"
    if max_new_tokens is not None and prompt_tokens + max_new_tokens > n_ctx:
        return (f"the context holds {n_ctx} tokens; the prompt is {prompt_tokens} tokens and {name} asks for "
                f"{max_new_tokens} more", name)
    return None


def check_request(target: Backend, prompt_ids: list[int], k: int, params: SamplingParams | None = None) -> None:
    """Reject requests the loop cannot serve, with the fix in the message."""
    if not prompt_ids:
        raise InvalidRequestError("the prompt is empty: give at least one token of text")
    for i, tok in enumerate(prompt_ids):
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= tok < target.vocab_size:
            raise InvalidRequestError(
                f"prompt token ids must be integers in [0, {target.vocab_size}), got {tok!r} at position {i}")
    if problem := context_problem(target.n_ctx, len(prompt_ids)):
        raise InvalidRequestError(f"{problem[0]}: shorten the prompt or raise n_ctx (--n-ctx)")
    if not isinstance(k, int) or k < 0:
        raise InvalidRequestError(f"K (draft length) must be an integer >= 0, got {k!r}")
    outside = [t for t, _ in params.logit_bias if t >= target.vocab_size] if params is not None else []
    if outside:
        raise InvalidRequestError(f"logit_bias names token {outside[0]}, outside {model_label(target)}'s vocabulary "
                                  f"[0, {target.vocab_size})")
