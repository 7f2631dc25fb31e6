"""Continuous batching: one forward per engine step for every active request.

A request's output does not depend on what else is in the batch beyond batch
numerics: on the toy backend (whose k-row forward equals k one-row forwards)
batched output equals solo output exactly, for mixed prompt lengths, methods,
K and sampling settings in one batch; sampled outputs keep the target's
distribution with several requests sharing every step; cancelling one request
mid-batch frees its sequence and leaves the others' outputs as they were; a
prompt longer than the prefill chunk is prefilled in chunks while others decode.
"""

from __future__ import annotations

import threading
import time

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.engine import Engine
from speclm.speculative.controller import GoodputController

from .stats import empirical_check, exact_distribution


class CountingToy(ToyBackend):
    """A toy target that records the size of every batched forward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def score_batch(self, items, last_rows=None, skip_rows=None):
        self.batches.append(len(items))
        return super().score_batch(items, last_rows, skip_rows)


def toy_llm(target: ToyBackend | None = None) -> LLM:
    """No shared suffix cache: what one request drafts from must not depend on when
    the others finished (the cache is a cross-request feature, tested on its own)."""
    return LLM(target=target or ToyBackend(6, seed=4, n_ctx=512),
               draft=ToyBackend(6, seed=8, order=1, n_ctx=512), max_sequences=16, suffix_cache_tokens=0)


MIXED = [  # (prompt, sampling, spec): every method with a deterministic K sequence
    ([0, 1, 2], SamplingParams(max_new_tokens=20), SpecConfig(method="ar")),
    ([1, 2, 3, 4, 5, 0, 1, 2, 3] * 4, SamplingParams(temperature=1.0, seed=1, max_new_tokens=30),
     SpecConfig(method="sd-draft", k=2)),
    ([2, 2, 2, 2], SamplingParams(temperature=0.7, top_p=0.8, seed=2, max_new_tokens=25),
     SpecConfig(method="sd-ngram", k=4, ngram_min=1)),
    ([3, 4] * 20, SamplingParams(temperature=1.3, top_k=3, seed=3, max_new_tokens=40),
     SpecConfig(method="sd-suffix", k=6)),
    ([5], SamplingParams(temperature=1.0, min_p=0.2, seed=4, max_new_tokens=15),
     SpecConfig(method="heuristic", k=5, proposal="draft")),
    ([0, 5, 0, 5, 0, 5], SamplingParams(max_new_tokens=33), SpecConfig(method="auto", k=8)),  # greedy: K-free
    ([4, 3, 2, 1] * 10, SamplingParams(temperature=0.9, seed=6, max_new_tokens=28, stop=("ab",)),
     SpecConfig(method="sd-draft", k=3)),
]


def run_batched(llm: LLM, jobs, **engine_kw) -> list:
    """One forward per step (split_forwards off: a toy's timings are noise); every job is queued
    before the engine's first step, so they start together however busy the machine is."""
    engine = Engine(llm, max_concurrency=len(jobs), start=False, **{"split_forwards": False, **engine_kw})
    handles = [engine.submit(p, sp, spec) for p, sp, spec in jobs]
    engine.start()
    out = [h.result(timeout=60) for h in handles]
    engine.shutdown()
    return out


def test_batched_outputs_equal_solo_outputs_exactly():
    solo_llm = toy_llm()
    solo = [solo_llm.generate(p, sp, spec).token_ids for p, sp, spec in MIXED]
    target = CountingToy(6, seed=4, n_ctx=512)
    llm = toy_llm(target)
    batched = run_batched(llm, MIXED)
    assert [r.token_ids for r in batched] == solo
    assert max(target.batches) == len(MIXED)  # all of them really shared forwards
    assert llm.target.live_sequences == 0


def test_each_round_is_one_forward_and_the_prompt_is_prefilled_once():
    """An AR request of n tokens alone in the engine costs n forwards: the prompt and
    the first token one (the prompt's last chunk carries the first round), then one a
    token; decoded tokens enter the KV through their rounds, never again as 'prefill'."""
    target = CountingToy(6, seed=4, n_ctx=512)
    llm = toy_llm(target)
    ar_solo = llm.generate([0, 1, 2, 3], SamplingParams(max_new_tokens=20), SpecConfig(method="ar"))
    target.batches.clear()
    target.scored_tokens = 0
    (res,) = run_batched(llm, [([0, 1, 2, 3], SamplingParams(max_new_tokens=20), SpecConfig(method="ar"))])
    assert res.token_ids == ar_solo.token_ids
    assert len(target.batches) == 20
    assert target.scored_tokens == 4 + 19


def test_batched_rounds_record_the_shared_forward():
    llm = toy_llm()
    results = run_batched(llm, MIXED[:3])
    shared = [r for res in results for r in res.rounds if r.batch_tokens]
    assert shared and all(r.batch_tokens > r.proposed + 1 for r in shared)


def test_sampling_stays_lossless_with_several_requests_per_step():
    """The first 3 tokens of 3000 sampled sd-draft requests, 8 in every step, match
    the enumerated target distribution within the sample-size bound."""
    target = ToyBackend(4, seed=11, order=2, sharpness=1.2, n_ctx=64)
    draft = ToyBackend(4, seed=99, order=1, sharpness=2.5, n_ctx=64)
    llm = LLM(target=target, draft=draft, max_sequences=8)
    prompt, params = [0, 1, 2, 0, 1], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=3)
    exact = exact_distribution(target, prompt, params, 3)
    engine = Engine(llm, max_concurrency=8, max_queue=4000)
    handles = [engine.submit(prompt, params, SpecConfig(method="sd-draft", k=2))  # unseeded: the p/q rule
               for _ in range(3000)]
    samples = [tuple(h.result(timeout=120).token_ids) for h in handles]
    engine.shutdown()
    tv, bound = empirical_check(samples, exact)
    assert tv < bound, (tv, bound)


class SlowToy(CountingToy):
    """Forwards take 3 ms: a request lasts long enough to be cancelled halfway."""

    def score_batch(self, items, last_rows=None, skip_rows=None):
        time.sleep(0.003)
        return super().score_batch(items, last_rows, skip_rows)


def test_cancelling_one_request_mid_batch_frees_it_and_spares_the_others():
    llm = toy_llm(SlowToy(6, seed=4, n_ctx=512))
    jobs = [([i, 1, 2], SamplingParams(temperature=1.0, seed=i, max_new_tokens=60), SpecConfig(method="sd-draft", k=3))
            for i in range(4)]
    solo = [llm.generate(p, sp, spec).token_ids for p, sp, spec in jobs]
    engine = Engine(llm, max_concurrency=4)
    started = threading.Event()
    handles = []
    for i, (p, sp, spec) in enumerate(jobs):
        handles.append(engine.submit(p, sp, spec))
    for text in handles[1].stream():  # cancel request 1 once it has produced something
        if text:
            handles[1].cancel()
            started.set()
            break
    results = [h.result(timeout=60) for h in handles]
    engine.shutdown()
    assert started.is_set() and results[1].finish_reason == "cancelled"
    assert len(results[1].token_ids) < 60
    assert [results[i].token_ids for i in (0, 2, 3)] == [solo[i] for i in (0, 2, 3)]
    assert llm.target.live_sequences == 0


def test_a_prompt_longer_than_the_prefill_chunk_is_prefilled_in_chunks_while_others_decode():
    target = CountingToy(6, seed=4, n_ctx=1024)
    llm = toy_llm(target)
    long_prompt = [(i * 7) % 6 for i in range(300)]
    jobs = [([0, 1], SamplingParams(max_new_tokens=40), SpecConfig(method="ar")),
            (long_prompt, SamplingParams(max_new_tokens=10), SpecConfig(method="sd-ngram", k=3))]
    solo = [llm.generate(p, sp, spec).token_ids for p, sp, spec in jobs]
    target.batches.clear()
    engine = Engine(llm, max_concurrency=2, prefill_chunk=64, start=False, split_forwards=False)
    handles = [engine.submit(p, sp, spec) for p, sp, spec in jobs]
    engine.start()
    results = [h.result(timeout=60) for h in handles]
    engine.shutdown()
    assert [r.token_ids for r in results] == solo
    assert sum(1 for b in target.batches if b == 2) >= 299 // 64  # prefill chunks rode along with decoding


def test_the_controller_stops_speculating_when_the_shared_forward_is_compute_bound():
    """Goodput of the whole step: alone a long block pays; beside 15 other tokens on a
    curve where every extra token costs a full step, K falls to 0."""
    from speclm.costs import CostModel
    cost = CostModel(verify_ms={1: 30.0, 2: 34.0, 4: 40.0, 8: 55.0, 16: 480.0, 24: 720.0, 32: 960.0})
    ctl = GoodputController(cost, k_max=7, alpha_prior=0.9, prior_weight=100)
    assert ctl.choose(7)[0] > 0
    ctl.share_step({seq: 1 for seq in range(16)}, 16.0, seq=16)
    assert ctl.choose(7)[0] == 0


def test_a_block_longer_than_the_others_is_priced_as_a_pass_of_its_own():
    """Beside 15 one-token blocks a 4-token block costs v(16) + v(3) where llama.cpp
    splits the forward by sequence, not v(19): a K that pays in one pass does not
    pay when it adds a pass."""
    from speclm.costs import CostModel
    curve = {1: 60.0, 2: 100.0, 3: 130.0, 4: 160.0, 8: 380.0, 16: 497.0, 20: 560.0}

    def k_beside(passes):
        ctl = GoodputController(CostModel(verify_ms=dict(curve), passes=passes), k_max=3,
                                alpha_prior=0.9, prior_weight=100)
        ctl.share_step({seq: 1 for seq in range(15)}, 15.0, seq=15)
        return ctl.choose(3)[0]

    def split(blocks):  # what llama.cpp does with one KV stream per sequence
        longest = max(blocks.values())
        return [len(blocks)] + ([longest - 1] if longest > 1 else [])

    assert k_beside(None) == 3  # one pass: 19 rows cost little more than 16
    assert k_beside(split) == 0


def test_real_model_greedy_batched_matches_solo_within_batch_numerics():
    """SmolLM2, four requests sharing every forward: each greedy output equals its
    solo plain decoding, or first differs at a near-tie of plain decoding's logits."""
    from speclm.speculative.identity import compare_to_ar
    llm = LLM(target="smollm2-135m", n_threads=2, max_sequences=4, n_ctx=512)
    prompts = ["def add(a, b):", "The capital of France is", "for i in range(10):", "Once upon a time"]
    jobs = [(llm.encode(p), SamplingParams(max_new_tokens=24), SpecConfig(method=m, k=4))
            for p, m in zip(prompts, ["ar", "sd-ngram", "sd-suffix", "ar"])]
    solo = [llm.generate(ids, sp, SpecConfig(method="ar")).token_ids for ids, sp, _ in jobs]
    batched = run_batched(llm, jobs)
    for (ids, _, _), ar, res in zip(jobs, solo, batched):
        report = compare_to_ar(llm.target, ids, ar, res.token_ids)
        assert report.identical or report.ar_top2_margin < 1.0, report.describe()
    llm.close()


def test_prompts_arriving_together_prefill_first_come_first_served():
    """With nothing decoding, a step's prefill takes the capacity, earliest arrival first:
    of three 300-token prompts arriving at once, the first prefills whole in the first
    step (its first round folded in) and decodes from the next."""
    from speclm.speculative.steps import plan_step, run_step
    llm = toy_llm()
    prompt = [1, 2, 3, 4, 5] * 60
    gens = [llm.start(prompt, SamplingParams(max_new_tokens=4), SpecConfig(method="ar")) for _ in range(3)]
    first = plan_step(gens, capacity=512, prefill_chunk=64)
    # nothing decodes yet: the capacity, in order; A's prompt carries its first round (299 + pending)
    assert [(len(s.tokens), s.round is not None) for s in first] == [(300, True), (512 - 300, False)]
    run_step(llm.target, first)
    second = plan_step(gens, capacity=512, prefill_chunk=64)
    assert [(s.gen, len(s.tokens), s.round is not None) for s in second] == [
        (gens[0], 1, True), (gens[1], 64, False), (gens[2], 64, False)]  # A decodes; B and C a chunk each


def test_beside_decoding_requests_each_prompt_advances_a_chunk_a_step_within_the_step_bound():
    """Beside a decoding request every prefilling prompt puts at most `prefill_chunk` rows
    in a step, first come first served until `prefill_step` rows in all: a wave of short
    prompts goes in one forward, a long prompt holds the decoder up by one chunk a step."""
    from speclm.speculative.steps import plan_step, run_step
    llm = toy_llm()
    decoding = llm.start([3, 4, 5], SamplingParams(max_new_tokens=8), SpecConfig(method="ar"))
    run_step(llm.target, plan_step([decoding], capacity=512))
    assert decoding.prefill_left == []
    short = [llm.start([1, 2, 3, 4] * 5 + [i], SamplingParams(max_new_tokens=4), SpecConfig(method="ar"))
             for i in range(3)]
    long = llm.start([1, 2, 3, 4, 5] * 60, SamplingParams(max_new_tokens=4), SpecConfig(method="ar"))
    slots = plan_step([decoding, *short, long], capacity=512, prefill_chunk=64, prefill_step=100)
    # the short prompts (21 rows) whole, each with its first round folded in; the long one what is left of 100
    assert [(s.gen, len(s.tokens)) for s in slots] == [
        (decoding, 1), (short[0], 21), (short[1], 21), (short[2], 21), (long, 100 - 63)]
    slots = plan_step([decoding, long], capacity=512, prefill_chunk=64, prefill_step=100)
    assert [(s.gen, len(s.tokens)) for s in slots] == [(decoding, 1), (long, 64)]


def test_drafting_beside_a_prefill_chunk_must_yield_as_much_as_the_prompt_rows_it_delays():
    """On a compute-bound curve (every row ~24 ms) a well-accepted draft beside a
    256-row prefill chunk looks cheap when the chunk's rows count for nothing (its
    rows only make the step slow); counted as the work they are, it does not pay:
    each drafted row would delay a prompt row for less than a row's yield."""
    from speclm.costs import CostModel
    curve = {1: 47.0, 2: 78.0, 4: 116.0, 8: 283.0, 16: 384.0, 32: 780.0, 64: 1428.0, 128: 2943.0, 256: 6946.0}
    ctl = GoodputController(CostModel(verify_ms=curve), k_max=15, alpha_prior=0.8, prior_weight=100)
    assert ctl.choose(15)[0] > 0  # alone, drafting pays
    ctl.share_step({0: 256}, 0.0, seq=1)
    assert ctl.choose(15)[0] > 0  # the old accounting: the chunk is pure cost, a draft looks nearly free
    ctl.share_step({0: 256}, 256.0, seq=1)
    assert ctl.choose(15)[0] == 0


def test_a_step_counts_prefill_chunk_rows_in_the_yield_its_decoders_plan_for():
    from speclm.speculative.steps import plan_step

    class Spy:
        def __init__(self):
            self.shared = []

        def share_step(self, blocks, expected, seq, split=False, joint=False):
            self.shared.append((dict(blocks), expected))

        def choose(self, k_cap):
            return 0, None

        def observe(self, rec):
            pass

    llm = toy_llm()
    decoding = llm.start([1, 2, 3], SamplingParams(max_new_tokens=8), SpecConfig(method="ar"))
    decoding.begin()
    decoding.prefilled(len(decoding.prefill_left))
    decoding.controller = spy = Spy()
    waiting = llm.start([1, 2, 3, 4, 5] * 20, SamplingParams(max_new_tokens=4), SpecConfig(method="ar"))
    plan_step([decoding, waiting], capacity=512, prefill_chunk=64)
    (blocks, expected), = spy.shared
    assert blocks == {waiting.seq: 64} and expected == 64.0


ZEN3_CURVE = {1: 47.0, 2: 78.0, 4: 116.0, 8: 283.0, 12: 377.0, 16: 384.0}  # ms, measured alone on a Zen 3


def test_a_step_runs_as_smaller_forwards_where_the_measured_curve_prices_them_cheaper():
    """v(8) > 2 v(4) on that curve: eight one-token blocks run as two forwards of four;
    sixteen stay one forward (v(16) < 2 v(8)); on a linear curve nothing splits."""
    from types import SimpleNamespace

    from speclm.speculative.steps import Slot, forwards
    from speclm.costs import CostModel

    def slots(n):
        return [Slot(SimpleNamespace(seq=i), [7]) for i in range(n)]

    def sizes(n, curve):
        return [len(g) for g in forwards(ToyBackend(6, seed=4), slots(n), CostModel(verify_ms=dict(curve)))]

    assert sizes(8, ZEN3_CURVE) == [4, 4]
    assert sizes(16, ZEN3_CURVE) == [16]
    assert sizes(8, {1: 10.0, 16: 160.0}) == [8]
    assert [len(g) for g in forwards(ToyBackend(6, seed=4), slots(8), None)] == [8]


def test_a_drafted_row_is_priced_in_the_forwards_the_step_will_run_as():
    """Seven one-token blocks and a request choosing K: as one forward the curve makes
    a draft look nearly free (v(9) − v(8) = 15 ms), but the step runs split, 2 v(4) =
    260 ms, and a draft pushes it back to one forward of 345 ms: the engine that
    splits must see that and decode plainly."""
    from speclm.costs import CostModel
    from speclm.speculative.controller import GoodputController
    curve = {1: 60.0, 2: 100.0, 3: 115.0, 4: 130.0, 5: 200.0, 6: 260.0, 8: 330.0, 9: 345.0, 10: 360.0,
             12: 380.0, 16: 436.0}
    cost = CostModel(verify_ms=curve)
    others = {i: 1 for i in range(7)}
    assert cost.groups({**others, 99: 1}) == [[0, 1, 2, 3], [4, 5, 6, 99]]
    price = cost.pricer(others, 99, split=True)
    assert price(1) == 260.0 and price(2) == 345.0  # 4 + 5 rows = 330 is not 10 % cheaper than one forward
    assert cost.pricer(others, 99)(1) == 330.0
    chosen = {}
    for split in (False, True):
        ctl = GoodputController(cost, k_max=3, alpha_prior=0.6, prior_weight=100)
        ctl.share_step(others, 7.0, 99, split)
        chosen[split] = ctl.choose(3)[0]
    assert chosen == {False: 1, True: 0}


def test_split_forwards_change_nothing_but_the_forwards():
    """With a curve on which every step is cheaper split, eight requests (mixed methods
    and sampling) still emit exactly their solo outputs."""
    from speclm.costs import CostModel
    target = CountingToy(6, seed=4, n_ctx=512)
    llm = toy_llm(target)
    jobs = (MIXED + MIXED)[:8]
    solo = [llm.generate(p, sp, spec).token_ids for p, sp, spec in jobs]
    engine = Engine(llm, max_concurrency=8, start=False)
    engine.forward_costs = CostModel(verify_ms={2 ** i: 4.0 ** i for i in range(10)})  # v(n) = n², convex
    handles = [engine.submit(p, sp, spec) for p, sp, spec in jobs]
    target.batches.clear()
    engine.start()
    results = [h.result(timeout=60) for h in handles]
    engine.shutdown()
    assert [r.token_ids for r in results] == solo
    assert max(target.batches) < 8  # no forward carried all eight
