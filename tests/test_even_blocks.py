"""Even blocks: a batched step re-cuts its requests' drafts to one block length.

llama.cpp, with one KV stream per sequence, scores a step in passes of equal
blocks, so a request that drafts beside others' one-token blocks pays a pass of
its own and keeps nothing, even where every request drafting together would
pay (docs/design.md#even-blocks). The step then picks one length for all the
re-cuttable rounds, padding shorter drafts. What a request emits stays the
target's: greedy outputs equal solo plain decoding, sampled ones keep the
target's distribution with padded drafts in every step; the step evens only
where the curve prices it faster.
"""

from __future__ import annotations

from collections import Counter

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.costs import CostModel
from speclm.engine import Engine
from speclm.speculative.controller import GoodputController

from .stats import empirical_check, exact_distribution

ZEN4_CURVE = {1: 30.0, 2: 56.0, 4: 108.0, 8: 222.0, 16: 269.0, 32: 420.0, 64: 760.0}  # ms, 1.5B target, alone


class EqualPassToy(ToyBackend):
    """A toy target whose forwards split into passes as llama.cpp's do with one KV
    stream per sequence: the same number of tokens from every sequence still holding some."""

    def pass_rows(self, blocks: dict[int, int]) -> list[int]:
        left, rows = {s: n for s, n in blocks.items() if n > 0}, []
        while left:
            m = min(left.values())
            rows.append(m * len(left))
            left = {s: n - m for s, n in left.items() if n > m}
        return rows


def engine_on(llm: LLM, curve: dict[int, float], n: int) -> Engine:
    engine = Engine(llm, max_concurrency=n, max_queue=4000, start=False)
    engine.forward_costs = CostModel(verify_ms=dict(curve), passes=llm.target.pass_rows,
                                     order=llm.target.batch_order)
    return engine


def even_rounds(results) -> Counter:
    """(drafted tokens verified, padding tokens) of every round the step re-cut."""
    return Counter((r.proposed, (r.info or {}).get("padded")) for res in results for r in res.rounds
                   if (r.info or {}).get("choice") == "the step's even block")


def test_alone_a_request_drafting_beside_one_token_blocks_keeps_nothing():
    """The trap the step gets out of: on Zen 4's curve, beside 7 one-token blocks a
    drafted block costs a pass of its own, so even a certain draft is cut to 0."""
    cost = CostModel(verify_ms=dict(ZEN4_CURVE), passes=EqualPassToy(6).pass_rows)
    ctl = GoodputController(cost, k_max=4, per_position=True)
    ctl.share_step({seq: 1 for seq in range(7)}, 7.0, seq=7)
    assert ctl.choose_prefix([0.99] * 4, match_len=32, support=(50,) * 4) == 0


def test_greedy_outputs_equal_solo_outputs_with_the_blocks_evened():
    target = EqualPassToy(6, seed=4, n_ctx=512)
    llm = LLM(target=target, max_sequences=8, suffix_cache_tokens=0)
    jobs = [([i % 6, (i + 1) % 6] * 10, SamplingParams(max_new_tokens=40), SpecConfig(method="auto", k=8))
            for i in range(8)]
    solo = [llm.generate(p, sp, spec).token_ids for p, sp, spec in jobs]
    engine = engine_on(llm, ZEN4_CURVE, 8)
    handles = [engine.submit(p, sp, spec) for p, sp, spec in jobs]
    engine.start()
    results = [h.result(timeout=60) for h in handles]
    engine.shutdown()
    assert [r.token_ids for r in results] == solo
    evened = even_rounds(results)
    assert sum(n for (k, _), n in evened.items() if k > 0) >= 8  # the steps drafted together
    assert llm.target.live_sequences == 0


def test_sampled_outputs_keep_the_target_distribution_with_padded_drafts():
    """3000 auto requests of 10 tokens, 8 in every step, on a curve where rows are nearly
    free (so a step evens to its longest draft and pads the rest): the first 3 tokens
    match the enumerated target distribution within the sample-size bound."""
    target = EqualPassToy(4, seed=11, order=2, sharpness=1.2, n_ctx=64)
    llm = LLM(target=target, max_sequences=8, suffix_cache_tokens=0)
    prompt, params = [0, 1, 2, 0, 1, 2, 0, 1], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10)
    exact = exact_distribution(target, prompt, params, 3)
    engine = engine_on(llm, {1: 100.0, 64: 110.0}, 8)
    handles = [engine.submit(prompt, params, SpecConfig(method="auto", k=4)) for _ in range(3000)]
    engine.start()
    results = [h.result(timeout=120) for h in handles]
    engine.shutdown()
    evened = even_rounds(results)
    assert sum(n for (_, pad), n in evened.items() if pad) >= 1000  # about 3,100 rounds verified padding
    tv, bound = empirical_check([tuple(r.token_ids[:3]) for r in results], exact)
    assert tv < bound, (tv, bound)


def test_the_step_evens_only_where_the_curve_prices_it_faster():
    """On a linear curve (every row costs what a one-row step costs) no step drafts
    together (it may only cut drafts that would cost passes of their own); on Zen 4's
    the same requests do."""
    def evened_on(curve):
        target = EqualPassToy(6, seed=4, n_ctx=512)
        llm = LLM(target=target, max_sequences=8, suffix_cache_tokens=0)
        engine = engine_on(llm, curve, 8)
        handles = [engine.submit([i % 6, (i + 1) % 6] * 10, SamplingParams(max_new_tokens=30),
                                 SpecConfig(method="auto", k=8)) for i in range(8)]
        engine.start()
        results = [h.result(timeout=60) for h in handles]
        engine.shutdown()
        return sum(n for (k, _), n in even_rounds(results).items() if k > 0)

    assert evened_on({1: 30.0, 64: 1920.0}) == 0
    assert evened_on(ZEN4_CURVE) > 0


def test_a_request_near_its_end_does_not_hold_the_others_back():
    """A request with room for no draft (its last token) verifies none; the seven others
    still draft together, its one-token block priced as the pass it costs of its own."""
    from types import SimpleNamespace

    from speclm.costs import expected_tokens
    from speclm.speculative.loop import Round
    from speclm.speculative.proposers.base import Draft
    from speclm.speculative.steps import Slot, even_blocks

    cut: dict[int, int] = {}

    def recut(rnd, m, seq):
        cut[seq] = m
        return Round(Draft([5] * m, [None] * m, [0.99] * m), [1] + [5] * m)

    slots = []
    for seq in range(8):
        full = Draft([5] * 8, [None] * 8, [0.99] * 8)
        rnd = Round(Draft(), [1], full=full, expected=tuple(expected_tokens(full.confidence)),
                    room=0 if seq == 0 else 8)
        slots.append(Slot(SimpleNamespace(seq=seq, recut=lambda r, m, seq=seq: recut(r, m, seq)), [1], rnd))
    even_blocks(slots, {}, CostModel(verify_ms=dict(ZEN4_CURVE), passes=EqualPassToy(6).pass_rows))
    assert cut[0] == 0 and {cut[seq] for seq in range(1, 8)} == {8}
    assert [len(s.tokens) for s in slots] == [1] + [9] * 7


def test_only_rounds_whose_controller_prices_prefixes_may_be_recut():
    """sd-suffix drafts with the same proposer at a fixed K: its rounds, drafted or empty,
    keep their blocks (their K is the user's, not priced); an auto round with nothing
    drafted may still be padded."""
    llm = LLM(target=EqualPassToy(6, seed=4, n_ctx=512), max_sequences=8, suffix_cache_tokens=0)

    def first_round(method):
        gen = llm.start([0, 3, 5], SamplingParams(max_new_tokens=8), SpecConfig(method=method, k=4))
        gen.begin()
        gen.prefilled(len(gen.prefill_left))
        gen.controller.share_step({99: 1}, 1.0, gen.seq, joint=True)
        rnd = gen.plan()
        gen.close()
        return rnd

    fixed, priced = first_round("sd-suffix"), first_round("auto")
    assert not fixed.draft.tokens and fixed.full is None
    assert not priced.draft.tokens and priced.full is not None and priced.expected == (1.0,)


def test_uneven_blocks_priced_within_a_few_percent_of_one_length_are_evened():
    """Requests planned one after another can settle on five blocks of 17 beside eleven of
    one (a certain draft joins the second pass once one request has paid for it), priced
    within 5 % of one length for all: the step takes one length, which runs in one pass
    and keeps every request in step (a serving curve like a Zen 4's)."""
    from types import SimpleNamespace

    from speclm.costs import expected_tokens
    from speclm.speculative.loop import Round
    from speclm.speculative.proposers.base import Draft
    from speclm.speculative.steps import Slot, even_blocks

    curve = {1: 33.0, 2: 60.0, 4: 93.0, 8: 190.0, 16: 200.0, 32: 427.0, 64: 769.0}
    cost = CostModel(verify_ms=curve, passes=EqualPassToy(6).pass_rows)

    def recut(rnd, m):
        return Round(Draft([5] * m, [None] * m, [0.999] * m), [1] + [5] * m, full=rnd.full,
                     expected=rnd.expected, room=rnd.room)

    slots = []
    for seq in range(16):
        full = Draft([5] * 16, [None] * 16, [0.999] * 16)
        planned = 16 if seq < 5 else 0
        rnd = Round(Draft([5] * planned, [None] * planned, [0.999] * planned), [1] + [5] * planned, full=full,
                    expected=tuple(expected_tokens(full.confidence)), room=16)
        slots.append(Slot(SimpleNamespace(seq=seq, recut=recut), rnd.block, rnd))
    planned_tokens = sum(s.round.expected[len(s.round.draft)] for s in slots)
    planned = planned_tokens / cost.step({q: len(s.tokens) for q, s in enumerate(slots)})
    even = 16 * slots[0].round.expected[3] / cost.step({q: 4 for q in range(16)})
    assert planned < even < 1.05 * planned  # one length is priced faster, by less than 5 %
    even_blocks(slots, {}, cost)
    assert len({len(s.tokens) for s in slots}) == 1


def test_blocks_planned_at_one_length_are_recut_only_for_a_five_percent_gain():
    """Eight requests planned at K = 0 each hold a one-token draft; verifying it makes a
    16-row step of 300 ms instead of an 8-row one of 200 ms. At an estimate of 0.55 that
    is priced 3 % faster, and the blocks stay; at 0.62, 8 % faster, and they are re-cut.
    (Sixteen-row steps are the curve's largest: longer blocks are not tried.)"""
    from types import SimpleNamespace

    from speclm.costs import expected_tokens
    from speclm.speculative.loop import Round
    from speclm.speculative.proposers.base import Draft
    from speclm.speculative.steps import Slot, even_blocks

    cost = CostModel(verify_ms={1: 30.0, 8: 200.0, 16: 300.0}, passes=EqualPassToy(6).pass_rows)

    def step_blocks(confidence: float) -> list[int]:
        def recut(rnd, m):
            return Round(Draft([5] * m, [None] * m, [confidence] * m), [1] + [5] * m)

        slots = []
        for seq in range(8):
            full = Draft([5, 5], [None, None], [confidence, confidence])
            rnd = Round(Draft(), [1], full=full, expected=tuple(expected_tokens(full.confidence)), room=8)
            slots.append(Slot(SimpleNamespace(seq=seq, recut=recut), rnd.block, rnd))
        even_blocks(slots, {}, cost)
        return [len(s.tokens) for s in slots]

    assert step_blocks(0.55) == [1] * 8
    assert step_blocks(0.62) == [2] * 8
