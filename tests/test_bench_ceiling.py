"""The copy ceiling (speclm.bench.analysis.ceiling): a perfect controller's speedup with a
run's drafts and cost curve. Hand-made token sequences with known answers, the
oracle bounding the real suffix drafter at every position. The real-model run
that reports it is test_bench.py's SmolLM2 end-to-end test."""

from __future__ import annotations

import numpy as np
import pytest

from speclm.bench.analysis import ceiling
from speclm.bench.output.sections import lines_of
from speclm.bench.output.speculation import ceiling_section
from speclm.costs import MIN_FORWARDS, cost_ratios, observed_curve
from speclm.sampling import SamplingParams
from speclm.speculative.proposers.suffix import SuffixProposer
from speclm.speculative.proposers.suffix_index import SuffixCache, SuffixConfig

FLAT = [0.0] + [1.0] * 20  # every block costs one decode step


def test_cost_ratios_interpolate_untimed_block_sizes():
    r = cost_ratios({1: 10.0, 3: 30.0, 5: 20.0}, k_max=4)
    assert r[1:] == pytest.approx([1.0, 2.0, 3.0, 2.5, 2.0])


def test_least_cost_without_drafts_is_plain_decoding():
    assert ceiling.least_cost([0, 0, 0, 0], FLAT) == (4.0, 4)


def test_least_cost_takes_whole_runs_when_blocks_are_free():
    assert ceiling.least_cost([3, 0, 0, 0, 1, 0], FLAT) == (2.0, 2)  # 4 tokens in one round, then 2


def test_least_cost_declines_a_block_that_costs_more_than_its_tokens():
    ratio = [0.0, 1.0, 3.0, 4.0, 5.0]  # a block of b rows costs more than b steps: never worth it
    assert ceiling.least_cost([3, 2, 1, 0], ratio) == (4.0, 4)


def test_least_cost_uses_a_cheap_long_block_on_a_non_monotonic_curve():
    ratio = [0.0, 1.0, 1.8, 3.5, 2.2]  # v(4) < v(3): a block of 4 beats a block of 3
    cost, rounds = ceiling.least_cost([3, 2, 1, 0], ratio)
    assert (cost, rounds) == (pytest.approx(2.2), 1)


def test_least_cost_never_exceeds_plain_decoding():
    rng = np.random.default_rng(0)
    for _ in range(50):
        runs = [int(x) for x in rng.integers(0, 6, size=30)]
        ratio = [0.0, 1.0, *rng.uniform(0.5, 9.0, size=8)]
        cost, rounds = ceiling.least_cost(runs, ratio)
        assert cost <= 30.0 + 1e-9 and 1 <= rounds <= 30


def test_best_occurrence_follows_the_longest_earlier_continuation():
    history = "\0" + ceiling._chars([7, 5, 6, 1, 7, 5, 6, 8, 9])
    # the context ends with 5; after the earlier 5s come 6 1 and 6 8 9: the oracle picks 6 8 9
    assert ceiling.best_occurrence_runs(history, [4, 5], [6, 8, 9, 3], k_max=16) == [3, 2, 1, 0]
    assert ceiling.best_occurrence_runs(history, [4, 5], [6, 8, 9, 3], k_max=2) == [2, 2, 1, 0]


def test_best_occurrence_copies_from_the_prompt_and_the_output_so_far():
    # at the start the 1 at the prompt's head is followed by 2 3 1, and the copy runs on into itself
    assert ceiling.best_occurrence_runs("", [1, 2, 3, 1], [2, 3, 1, 2, 4], k_max=16) == [4, 3, 2, 1, 0]
    assert ceiling.best_occurrence_runs("", [9, 1], [2, 3], k_max=16) == [0, 0]  # nothing earlier to copy


def test_the_oracle_bounds_the_suffix_drafter_at_every_position():
    """The docstring's claim: whatever the suffix drafter drafts is a run the oracle sees too."""
    rng = np.random.default_rng(3)
    cache, history = SuffixCache(), ""
    for n in range(16):
        prompt = [int(x) for x in rng.integers(0, 6, size=int(rng.integers(5, 40)))]
        output = [int(x) for x in rng.integers(0, 6, size=int(rng.integers(1, 40)))]
        if n % 4 == 0:  # a repeat running into the output: the drafter copies on into its own draft
            prompt, output = prompt[:3] * 4, prompt[:3] * 9 + output
        proposer = SuffixProposer(cache)
        proposer.begin(prompt, SamplingParams(temperature=0.0))
        mine = ceiling.drafter_runs(proposer, prompt, output, k_max=8)
        proposer.close()
        best = ceiling.best_occurrence_runs(history, prompt, output, k_max=8)
        history += "\0" + ceiling._chars(prompt + output)
        assert len(mine) == len(best) == len(output)
        assert all(0 <= m <= b for m, b in zip(mine, best)), (mine, best)


def _ar(category: str, index: int, output: list[int], **kw) -> dict:
    return {"category": category, "prompt_index": index, "method": "ar", "temperature": 0.0, "repeat": 0,
            "max_new_tokens": 64, "token_ids": output, "target_name": "t", **kw}


def test_copy_ceiling_learns_across_a_categorys_requests_and_skips_other_records():
    answer = list(range(100, 130))
    requests = [_ar("edit", 0, answer), _ar("edit", 1, answer),
                _ar("edit", 2, [1] * 30, temperature=0.8), _ar("edit", 3, [1] * 30, repeat=1),
                _ar("edit", 4, [1] * 30, method="auto")]
    prompts = {("edit", i): [1, 2, 3] for i in range(5)}
    curve = {1: 10.0, 17: 10.0}  # flat: a perfect controller verifies every correct token
    ar = ceiling.greedy_ar(requests)
    assert [r["prompt_index"] for r in ar] == [0, 1]
    (row,) = ceiling.copy_ceiling(ar, prompts, {"edit": curve}, methods=["auto"])
    assert row["tokens"] == 60 and row["methods"] == ["auto"] and row["k_max"] == 16
    # request 0 has nothing to copy: 30 plain rounds. Request 1 finds request 0 in the cache; the
    # drafter drafts as many tokens as it has matched (3 after the prompt, then 7, then 15 at most):
    # rounds ending at 4, 12, 28, 30. The oracle takes 16 at once: rounds ending at 17 and 30.
    assert row["drafter_rounds"] == 30 + 4 and row["drafter_ceiling"] == pytest.approx(60 / 34)
    assert row["best_rounds"] == 30 + 2 and row["best_ceiling"] == pytest.approx(60 / 32)
    # with rematch the draft goes on from the longer match the drafted tokens make: 16 at once
    assert row["rematch_rounds"] == 30 + 2 and row["rematch_ceiling"] == pytest.approx(60 / 32)


def test_a_prediction_ceiling_drafts_the_expected_output_from_its_first_token():
    """Where a prompt carries a prediction, the drafter given it drafts the answer at once (with
    an edit inside, realigned after it); categories without predictions have no such column."""
    answer = list(range(100, 130))
    predicted = answer[:10] + [7] + answer[10:]  # a token the answer leaves out
    requests = [_ar("apply", 0, answer), _ar("chat", 0, answer)]
    prompts = {("apply", 0): [1, 2, 3], ("chat", 0): [1, 2, 3]}
    flat = {1: 10.0, 17: 10.0}
    apply, chat = ceiling.copy_ceiling(requests, prompts, {"apply": flat, "chat": flat},
                                       predictions={("apply", 0): predicted})
    assert apply["drafter_rounds"] == 30  # nothing to copy without the prediction
    # the prediction drafts tokens 0-9 (and 7: rejected), the answer realigns on its tail: 3 rounds
    assert apply["prediction_rounds"] == 3 and apply["prediction_ceiling"] == pytest.approx(30 / 3)
    assert "prediction_ceiling" not in chat


def test_a_rematch_draft_can_splice_sources_where_no_single_occurrence_runs_on():
    """The scaffold 5 6 7 8 ends in an earlier request; the answer goes on as the prompt did after
    7 8. No earlier occurrence of 6 runs on past 8, so the best single copy takes 2 tokens; the
    rematch drafter takes 6 (the oracle bounds single-source drafts, not spliced ones)."""
    cache = SuffixCache()
    cache.add([5, 6, 7, 8])
    prompt, output = [7, 8, 30, 31, 32, 33, 40, 5, 6], [7, 8, 30, 31, 32, 33]
    history = "\0" + ceiling._chars([5, 6, 7, 8])
    runs = {}
    for name, cfg in (("single", SuffixConfig()), ("rematch", SuffixConfig(rematch=True))):
        proposer = SuffixProposer(cache, cfg)
        proposer.begin(prompt, SamplingParams(temperature=0.0))
        runs[name] = ceiling.drafter_runs(proposer, prompt, output, k_max=16)[0]
    assert runs == {"single": 2, "rematch": 6}
    assert ceiling.best_occurrence_runs(history, prompt, output, k_max=16)[0] == 2


def test_copy_ceiling_is_empty_without_greedy_ar_records():
    assert ceiling.greedy_ar([_ar("c", 0, [5, 6], temperature=1.0)]) == []
    assert ceiling.copy_ceiling([], {}, {}) == []


def test_each_category_is_priced_by_its_own_curve():
    requests = [_ar("a", 0, [7, 7, 7, 7]), _ar("b", 0, [7, 7, 7, 7])]
    prompts = {("a", 0): [7, 7], ("b", 0): [7, 7]}
    cheap, dear = {1: 10.0, 17: 10.0}, {1: 10.0, 2: 40.0, 17: 400.0}  # dear: no block ever pays
    a, b = ceiling.copy_ceiling(ceiling.greedy_ar(requests), prompts, {"a": cheap, "b": dear})
    assert a["drafter_ceiling"] > 1.0 and b["drafter_ceiling"] == pytest.approx(1.0)
    assert b["v_ms"]["2"] == 40.0


def test_a_size_the_requests_ran_often_is_priced_by_their_own_forwards():
    timed = {1: 56.0, 2: 87.0, 3: 116.0, 17: 470.0}
    forwards = [(1, 50.0)] * 9 + [(1, 70.0)] * 2 + [(2, 88.0)] * MIN_FORWARDS + [(3, 300.0)] * (MIN_FORWARDS - 1)
    curve, counts = observed_curve(timed, forwards)
    assert counts == {1: 11, 2: MIN_FORWARDS, 3: MIN_FORWARDS - 1}
    assert curve[1] == 50.0 and curve[2] == 88.0  # medians: one slow step does not move v(1)
    # a size run too rarely keeps its timed price, scaled as the nearest size the requests ran often
    assert curve[3] == pytest.approx(116.0 * 88.0 / 87.0) and curve[17] == pytest.approx(470.0 * 88.0 / 87.0)


def test_without_enough_forwards_the_timed_curve_stands():
    timed = {1: 56.0, 2: 87.0}
    assert observed_curve(timed, []) == (timed, {})
    assert observed_curve(timed, [(1, 10.0)] * (MIN_FORWARDS - 1))[0] == timed


def test_observed_curves_count_one_targets_single_forwards_per_category():
    timed = {"a": {1: 60.0, 2: 90.0}, "b": {1: 60.0, 2: 90.0}}
    mine = [{"target_name": "t", "category": "a", "proposed": 0, "verify_ms": 50.0}] * MIN_FORWARDS
    others = ([{"target_name": "u", "category": "a", "proposed": 0, "verify_ms": 10.0}] * MIN_FORWARDS
              + [{"target_name": "t", "category": "a", "proposed": 0, "verify_ms": 99.0,
                  "batch_passes": [1, 1]}] * MIN_FORWARDS)  # another target; a forward shared with others
    curves, counts = ceiling.observed_curves(timed, mine + others, "t")
    assert curves == {"a": {1: 50.0, 2: 75.0}, "b": timed["b"]}
    assert counts == {"a": {1: MIN_FORWARDS}, "b": {}}


def test_timing_context_is_the_average_rounds_context_cut_from_real_tokens():
    recs = [_ar("c", 0, [9] * 10), _ar("c", 1, [8] * 20)]
    ids = {("c", 0): [1, 2, 3, 4], ("c", 1): [5, 6]}
    ctx = ceiling.timing_context(recs, ids)  # (4 + 5 + 2 + 10) / 2 = 10.5 -> 10 tokens of request 1
    assert ctx == [5, 6] + [8] * 8


def test_render_sets_the_ceiling_beside_the_suffix_methods_measured_speedup():
    row = {"category": "edit", "target_name": "t", "max_new_tokens": 64, "methods": ["auto"],
           "drafter_ceiling": 1.19, "drafter_tokens_per_round": 1.5, "best_ceiling": 1.31,
           "best_tokens_per_round": 1.9}
    summary_rows = [{"category": "edit", "method": m, "k": 16, "temperature": 0.0, "max_new_tokens": 64,
                     "target_name": "t", "decode_speedup": s} for m, s in (("auto", 1.03), ("sd-ngram", 0.9))]
    text = "\n".join(lines_of(ceiling_section([row], summary_rows, several_targets=False)))
    assert "## Copy ceiling" in text and "auto K=16 1.03×" in text and "sd-ngram" not in text
    assert "1.19× (1.50 tok/round)" in text and "1.31× (1.90 tok/round)" in text
    assert lines_of(ceiling_section([], summary_rows, several_targets=False)) == []
