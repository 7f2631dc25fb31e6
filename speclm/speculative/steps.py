"""The one driver of rounds: one forward per step for every request in it, one
request being a batch of one (`generate`, `run_alone`; the engine steps many).

Every active request's prefill chunk or round block goes into ONE forward
(loop.score: one `score_batch`, one llama_decode), then each request runs
accept → resample → iterate on its own rows. Where the target's measured cost
curve prices a few smaller forwards cheaper than one (`forwards`: on a Zen 3,
8 one-token rows cost more than two forwards of 4), the step runs those.

The five stages stay where they are (speculative/loop.py): a request plans its
round (`Generation.plan` returns a `Round`: K and the draft), the step scores all
blocks together, and `Generation.complete` finishes each round from its rows. What a
request emits therefore depends on the batch only through batch numerics:
on a backend whose k-row forward equals k one-row forwards (the toy backend)
batched output equals unbatched output exactly.

Speculation knows the batch: before a request plans, its controller is told
the blocks the other requests put in the same forward and how many tokens they
are expected to emit (`share_step`), so its K maximises the whole step's
goodput: K falls to 0 once the forward is compute-bound, or when a block longer
than the others would cost a pass of its own (llama.cpp with one KV stream per
sequence runs unequal blocks in several passes; `Backend.pass_rows`). Since no
request alone can pay for every block growing, the engine's step then re-cuts
the requests' drafts to one length together where its curve prices that faster
(`even_blocks`).
Prefill is chunked while others decode (each prefilling request at most
`prefill_chunk` rows a step, `prefill_step` rows in all, first come first
served), so one long prompt cannot stall them while a wave of short ones goes
in one forward; a chunk's rows count as work in the step's goodput, so
drafts do not slow the prefill (and the first token) of waiting requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend
from ..costs import CostModel, clock_ms
from ..metrics import GenerationResult
from ..prefix_cache import common_prefix
from ..sampling import SamplingParams
from .loop import Generation, Round, score
from .proposers.base import Proposer

PREFILL_CHUNK = 256  # prompt rows a prefilling request puts in a step while other requests decode
PREFILL_STEP = 1024  # prompt rows a step holds in all while other requests decode (_prefill_chunks)
WAIT_FOR_START = 8  # a new request waits a step for a shared start this long or longer (_begin_new)


@dataclass
class Slot:
    """One request's part of a step: a prefill chunk, or its round's block."""

    gen: Generation
    tokens: list[int]
    round: Round | None = None  # None: a prefill chunk
    finished: bool = False
    error: BaseException | None = None


def plan_step(gens: list[Generation], capacity: int, prefill_chunk: int = PREFILL_CHUNK,
              split: bool = False, costs: CostModel | None = None, prefill_step: int = PREFILL_STEP) -> list[Slot]:
    """Each request's part of the next forward (decoding requests first, then prefill
    chunks; a prompt's last chunk carries its first round, Round.lead), at most
    `capacity` tokens in all (a folded round's drafts beyond it). A request whose plan fails or which
    finished without a forward (context full) gets a slot with no tokens; a new one
    waiting for a running request's prompt start (`_begin_new`) gets no slot yet.

    A decoding request plans knowing the rest of the step (`share_step`): the blocks
    planned before it, one token for each request still to plan, and the prefill
    chunks, so its K pays for the passes it adds to everyone's forward. The step's
    expected yield counts each prompt row as one unit of work done, like an emitted
    token: both are rows the workload needs, so a drafted row beside a prefill chunk
    must yield as much as the prompt row it delays (uncounted, a chunk would only
    make the step look slow, and drafting beside it look cheap). split: run_step
    may run the step as several forwards (a `costs` curve given), so K is priced so.
    costs (the target's curve, as run_step prices the step): the rounds' blocks may then
    be re-cut to one length together (`even_blocks`)."""
    slots, decoding, prefilling = [], [], []
    for gen in _begin_new(gens, slots):
        (prefilling if gen.prefill_left else decoding).append(gen)
    chunks = _prefill_chunks(prefilling, capacity, len(decoding), prefill_chunk, prefill_step)
    prefill = {g.seq: len(c) for g, c in zip(prefilling, chunks) if c}
    planned, expected = {}, float(sum(map(len, chunks)))  # a prompt row is work done, as a token is
    joint = costs is not None and len(decoding) > 1
    for i, gen in enumerate(decoding):
        rest = decoding[i + 1:]
        others = {**planned, **{g.seq: 1 for g in rest}, **prefill}
        slots.append(slot := _round_slot(gen, lambda: gen.controller.share_step(
            others, expected + len(rest), gen.seq, split, joint)))
        if slot.round is not None:
            planned[gen.seq] = len(slot.tokens)
            expected += gen.controller.expected_for(len(slot.round.draft))
    if joint:
        even_blocks(slots, prefill, costs)
        planned = {s.gen.seq: len(s.tokens) for s in slots if s.tokens}
    for gen, chunk in zip(prefilling, _prefill_chunks(prefilling, capacity, sum(planned.values()), prefill_chunk,
                                                       prefill_step)):
        if chunk:
            # the prompt's last chunk carries the first round (Round.lead): the first token comes
            # from the prompt's own forward, as in plain llama.cpp, not from one more
            folds = len(chunk) > len(gen.prefill_left)
            slots.append(_round_slot(gen, lead=chunk[:-1]) if folds else Slot(gen, chunk))
    return slots


def _round_slot(gen: Generation, before: Callable[[], None] | None = None, lead: Sequence[int] = ()) -> Slot:
    """gen's planned round as a slot (`before` runs first: the step it shares); a slot
    with no tokens when it fails or finished without a forward (context full)."""
    try:
        if before is not None:
            before()
        rnd = gen.plan(lead)
    except Exception as exc:  # noqa: BLE001  (the request fails, the step goes on)
        return Slot(gen, [], error=exc)
    return Slot(gen, rnd.block, rnd) if rnd is not None else Slot(gen, [], finished=True)


EVEN_GAIN = 1.05  # a step re-cuts blocks of one length only for a 5 % gain, and keeps unequal ones only for 5 %


def even_blocks(slots: list[Slot], prefill: dict[int, int], costs: CostModel) -> None:
    """Re-cut the step's re-cuttable rounds (Round.full) to the one block length L the
    curve prices fastest where that gains EVEN_GAIN over the blocks as planned, or,
    where the planned blocks differ in length, unless they are priced EVEN_GAIN faster
    (docs/design.md#even-blocks). llama.cpp, with one KV stream per sequence,
    scores a step in passes of equal blocks (Backend.pass_rows), so a block longer than
    the others costs a pass of its own, and a request pricing its own block beside the
    others' one-token blocks keeps none of its draft even where every request drafting
    would pay; requests planned one after another also settle on uneven shapes that
    price close to even ones, run worse and let some requests run ahead (a tie goes to
    one length). L maximises the step's expected tokens per ms over the lengths whose
    rows the curve measured (beyond its largest size it only extrapolates): each
    request's E(L − 1) from its own estimates (its draft padded where shorter: padding
    only costs rows; at most the drafts it has room for), prompt rows of `prefill`
    (seq: chunk rows) and the other slots' rounds counted as planned."""
    movable = [s for s in slots if s.round is not None and s.round.full is not None]
    if len(movable) < 2:
        return
    others = [s for s in slots if s.round is not None and s.round.full is None and s.tokens]
    fixed = {**{s.gen.seq: len(s.tokens) for s in others}, **prefill}
    fixed_expected = sum(prefill.values()) + sum(s.gen.controller.expected_for(len(s.round.draft)) for s in others)

    def drafts(s: Slot, m: int | None) -> int:
        """The drafts s verifies when the step evens to m (None: as planned); a request
        with less room left (max_new_tokens, context) verifies what it may."""
        return len(s.round.draft) if m is None else min(m, s.round.room)

    def rate(m: int | None) -> float:
        """Expected tokens per ms of the step with every movable round at m drafts (None: as planned)."""
        blocks = {**fixed, **{s.gen.seq: drafts(s, m) + 1 for s in movable}}
        tokens = sum(s.round.expected[min(drafts(s, m), len(s.round.full))] for s in movable)
        return (fixed_expected + tokens) / costs.step_as_run(blocks)
    longest = max(min(s.round.room, len(s.round.full)) for s in movable)
    measured = max(costs.verify_ms, default=0)  # beyond it the curve only extrapolates
    rates = {m: rate(m) for m in range(longest + 1)
             if m == 0 or sum(fixed.values()) + sum(drafts(s, m) + 1 for s in movable) <= measured}
    best = max(rates, key=rates.__getitem__)
    planned, even = rate(None), len({drafts(s, None) for s in movable}) == 1
    if (rates[best] < EVEN_GAIN * planned if even else planned > EVEN_GAIN * rates[best]) \
            or all(drafts(s, best) == drafts(s, None) for s in movable):
        return
    for s in movable:
        s.round = s.gen.recut(s.round, drafts(s, best))
        s.tokens = s.round.block


def _begin_new(gens: list[Generation], slots: list[Slot]) -> list[Generation]:
    """The requests that take part in this step, in order: those begun, and the new
    ones begun now (a failed begin gets an error slot). With prefix caching, a new
    request may fill its prompt's start from the KV of a running request of its scope
    (one ahead of it); one whose start such a request is still prefilling, further
    than the cache or any running KV could give it, waits a step rather than compute
    the same rows again: sixteen chats with one system prompt prefill it once."""
    ready: list[Generation] = []
    for gen in gens:
        if gen.seq is None:
            donors = [g for g in ready if g.prefix_cache is gen.prefix_cache
                      and g.cache_scope == gen.cache_scope] if gen.prefix_cache is not None else []
            if donors and _shared_start_is_coming(gen, donors):
                continue
            try:
                gen.begin(live=[g.seq for g in donors])
            except Exception as exc:  # noqa: BLE001  (the request fails, the step goes on)
                slots.append(Slot(gen, [], error=exc))
                continue
        ready.append(gen)
    return ready


def _shared_start_is_coming(gen: Generation, donors: list[Generation]) -> bool:
    """Is a prefilling donor's prompt going to hold more of gen's reusable start than
    the KV of every donor and the prefix cache hold now?"""
    prefilling = [d for d in donors if d.prefill_left]
    if not prefilling:
        return False
    want = np.asarray(gen.reusable_prompt, dtype=np.int32)
    coming = max(common_prefix(np.asarray(d.context[:d.prompt_end], dtype=np.int32), want) for d in prefilling)
    if coming < WAIT_FOR_START:
        return False
    return coming > gen.prefix_cache.reusable(gen.cache_scope, gen.reusable_prompt, gen.target,
                                              [d.seq for d in donors])


def _prefill_chunks(prefilling: list[Generation], capacity: int, shared: int, prefill_chunk: int,
                    prefill_step: int) -> list[list[int]]:
    """The prompt tokens each prefilling request puts in a step beside `shared`
    decoding tokens: at most `prefill_chunk` each and `prefill_step` in all (and what
    the capacity leaves), first come first served; with nothing decoding, the
    capacity. A long prompt thus holds the decoders up by one chunk a step, while a
    wave of short prompts arriving together prefills in one forward: llama.cpp runs
    the unequal chunks of a step in passes of its own (`Backend.pass_rows`), and
    fewer, larger passes cost less a row (a wave of 16 chat prompts, the first
    decoding while the other 15 prefill: 8.1 s of forwards with the 15 in one step,
    8.9 s in three of 256 rows; through `speclm serve` 1.05x the wave's tok/s,
    docs/results.md#u8).
    A request that scores its prompt (prompt logprobs: echo) takes at most
    `prefill_chunk` rows a step even alone: every row it scores comes back as a row
    of logits (the vocabulary in floats: 0.2 MB on SmolLM2, 0.6 MB on the 1.5B
    target), llama.cpp keeps an output buffer as large as the largest forward's for
    good, and the chunk's rows are reduced to log-probabilities before the next (a
    4095-token prompt in one forward kept 1 GB; docs/server.md#logprobs-echo-and-predictions)."""
    budget, each = (min(capacity - shared, prefill_step), prefill_chunk) if shared else (capacity, capacity)
    chunks = []
    for gen in prefilling:
        most = each if gen.prompt_logprobs is None else min(each, prefill_chunk)
        chunk = _prompt_rows(gen)[:max(0, min(budget, most))]
        budget -= len(chunk)
        chunks.append(chunk)
    return chunks


def _prompt_rows(gen: Generation) -> list[int]:
    """The rows gen's prompt still needs: `prefill_left`, then the pending token where
    the last chunk may carry the first round (Generation.folds_prompt)."""
    return [*gen.prefill_left, gen.context[-1]] if gen.folds_prompt else gen.prefill_left


def forwards(target: Backend, work: list[Slot], costs: CostModel | None) -> list[list[Slot]]:
    """The forwards a step runs: one over every slot, unless `costs` (the target's
    measured v(rows)) prices a split cheaper (CostModel.groups: 2–4 contiguous runs
    of the backend's batch order with about equal rows)."""
    if costs is None or len(work) < 2:
        return [work]
    by_seq = {s.gen.seq: s for s in work}
    blocks = {seq: len(by_seq[seq].tokens) for seq in target.batch_order(list(by_seq))}
    return [[by_seq[seq] for seq in g] for g in costs.groups(blocks)]


def run_step(target: Backend, slots: list[Slot], costs: CostModel | None = None) -> None:
    """Score every slot's tokens, in one forward unless `costs` prices a split
    cheaper (`forwards`), and finish each slot's round. `costs` is only read:
    learning it from the forwards run would compare the v(4) of a split step,
    observed, with the v(8) of the whole step, never run again."""
    work = [s for s in slots if s.tokens]
    if not work:
        return
    target.use_threads(work[0].gen.threads if len(work) == 1 else None)
    for group in forwards(target, work, costs):
        _run_forward(target, group)


def _run_forward(target: Backend, group: list[Slot]) -> None:
    t0 = clock_ms()
    try:
        dists = score(target, [(s.gen, s.tokens, s.round) for s in group])
    except Exception as exc:  # noqa: BLE001  (every request in the forward fails)
        for s in group:
            s.error = exc
        return
    ms = clock_ms() - t0
    passes = target.pass_rows({s.gen.seq: len(s.tokens) for s in group})
    for s, p in zip(group, dists):
        try:
            if s.round is None:
                s.gen.prefilled(len(s.tokens), p)
            else:
                s.finished = s.gen.complete(s.round, p, verify_ms=ms,
                                            batch_passes=None if len(group) == 1 else passes)
        except Exception as exc:  # noqa: BLE001
            s.error = exc


# ---- one request alone -----------------------------------------------------------
def step_alone(gen: Generation) -> bool:
    """One step of one request through the same driver (a prefill, or a round);
    True once it has finished. Its error is raised."""
    if gen.finished:
        return True
    slots = plan_step([gen], gen.target.n_ctx)
    run_step(gen.target, slots)
    slot = slots[0]
    if slot.error is not None:
        raise slot.error
    return slot.finished


def run_alone(gen: Generation) -> GenerationResult:
    """Step one request until it finishes (releasing its resources even on error)."""
    try:
        while not step_alone(gen):
            pass
    finally:
        gen.close()
    return gen.result()


def generate(target: Backend, proposer: Proposer | None, prompt_ids: list[int], params: SamplingParams,
             k: int, method: str = "sd", on_text: Callable[[str], None] | None = None,
             eos_ids: frozenset[int] | None = None, controller=None) -> GenerationResult:
    """Generate from prompt_ids; the output distribution is the target's.

    k is the draft length per round (k = 0 or no proposer: plain decoding);
    controller: speculative/controller.py (None: a fixed K). `on_text` receives
    final text as soon as it is known (streaming)."""
    return run_alone(Generation(target, proposer, prompt_ids, params, k, method, on_text, eos_ids, controller))
