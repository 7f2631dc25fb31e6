"""The goodput controller (method `auto`) on synthetic cost and acceptance
traces, and end to end: it speculates where that pays, falls back to plain
decoding where it does not, comes back when the workload changes, and never
changes the output."""

from __future__ import annotations

import numpy as np
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.metrics import RoundRecord
from speclm.costs import CostModel, expected_emitted, expected_tokens
from speclm.speculative.controller import (PROBE_BACKOFF, Calibration, GoodputController, HeuristicController,
                                           match_group, smoothed_estimate)

# Costs measured on this machine for the Qwen 1.5B target (ms to score b tokens).
QWEN_VERIFY = {1: 32.0, 2: 57.0, 3: 76.0, 4: 95.0, 5: 123.0, 6: 150.0, 7: 180.0, 8: 219.0, 9: 234.0}
# The Zen 4 curve with all logits (design note §6): not monotonic, 16 rows cost less than 9.
ZEN4_VERIFY = {1: 33.0, 2: 61.0, 4: 107.0, 8: 283.0, 9: 290.0, 12: 291.0, 16: 281.0, 17: 300.0}


def run_trace(ctrl: GoodputController, accept_prob: float, rounds: int, seed: int = 0,
              draft_ms: float = 0.0) -> list[int]:
    """Drive the controller with i.i.d. acceptance; return the K it chose per round."""
    rng = np.random.default_rng(seed)
    ks = []
    for _ in range(rounds):
        k, _note = ctrl.choose(8)
        a = 0
        while a < k and rng.random() < accept_prob:
            a += 1
        ks.append(k)
        ctrl.observe(RoundRecord(proposed=k, accepted=a, draft_ms=draft_ms * k,
                                 verify_ms=ctrl.cost.verify(k + 1), other_ms=0.5))
    return ks


def test_expected_emitted_matches_the_closed_form():
    assert expected_emitted(0.0, 4) == 1.0
    assert expected_emitted(1.0, 4) == 5.0
    assert expected_emitted(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_cost_model_interpolates_and_extrapolates():
    cost = CostModel(verify_ms={1: 10.0, 3: 30.0, 5: 40.0})
    assert cost.verify(2) == pytest.approx(20.0)
    assert cost.verify(7) == pytest.approx(40.0 * 7 / 5)  # beyond the curve: the top block's cost per row


def test_a_noisy_top_of_the_curve_does_not_misprice_a_prefill_chunk():
    """Calibrated to 17 rows on this Zen 3 (v(16) = 384, v(17) = 450 ms), a 255-row
    forward is priced near its measured 6.9 s, not at the last slope's 16.5 s."""
    cost = CostModel(verify_ms={1: 47.0, 8: 283.0, 16: 384.0, 17: 450.0})
    assert 5000 < cost.verify(255) < 8000


def test_speculates_where_it_pays():
    """Free drafts (n-gram) and 95 % acceptance on the measured Qwen costs: K > 0."""
    ctrl = GoodputController(CostModel(verify_ms=dict(QWEN_VERIFY)), k_max=8)
    ks = run_trace(ctrl, 0.95, 60)
    assert np.mean(ks[20:]) >= 2


def test_falls_back_to_plain_decoding_within_bounded_rounds():
    """A cheap (2 ms/token) draft at 30 % acceptance does not pay: K = 0 after a
    few rounds, apart from short probes (one every `probe_every` rounds,
    doubled only after a fully accepted probe)."""
    ctrl = GoodputController(CostModel(verify_ms=dict(QWEN_VERIFY), draft_ms_per_token=2.0), k_max=8,
                             probe_every=16)
    ks = run_trace(ctrl, 0.3, 400, draft_ms=2.0)
    first_zero = ks.index(0)
    assert first_zero <= 5
    tail = ks[first_zero:]
    assert sum(k > 0 for k in tail) <= len(tail) / 8  # probes: ~1/16 of rounds, plus rare doublings
    assert sum(tail) <= len(tail) / 5  # drafted tokens spent probing


def test_no_probes_when_speculation_cannot_pay_at_any_acceptance():
    """The measured Qwen pair: a 22 ms draft step against a 32 ms target step.
    Even at 98 % acceptance no K beats plain decoding, so auto never drafts."""
    ctrl = GoodputController(CostModel(verify_ms=dict(QWEN_VERIFY), draft_ms_per_token=22.0), k_max=8,
                             probe_every=4)
    ks = run_trace(ctrl, 0.99, 100, draft_ms=22.0)
    assert set(ks) == {0}
    assert "no K pays" in ctrl.choose(8)[1]


def test_speculation_comes_back_after_a_shift():
    ctrl = GoodputController(CostModel(verify_ms=dict(QWEN_VERIFY)), k_max=8, probe_every=8)
    low = run_trace(ctrl, 0.05, 60, seed=1)
    assert low[-10:].count(0) >= 8
    high = run_trace(ctrl, 0.98, 80, seed=2)
    assert np.mean(high[-20:]) >= 2, high


def test_heuristic_grows_after_full_acceptance_and_shrinks_after_rejection():
    h = HeuristicController(k_init=4, k_max=8)
    h.observe(RoundRecord(4, 4, 0, 0, 0))
    assert h.choose(8)[0] == 6
    h.observe(RoundRecord(6, 2, 0, 0, 0))
    assert h.choose(8)[0] == 5
    assert h.choose(3)[0] == 3


@pytest.mark.parametrize("method", ["auto", "heuristic"])
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_adaptive_methods_keep_greedy_output_identical(method, proposer):
    llm = LLM(target=ToyBackend(6, seed=3, order=2, sharpness=2.0), draft=ToyBackend(6, seed=1, order=1))
    params = SamplingParams(max_new_tokens=60)
    ar = llm.generate([0, 1, 2, 3], params, SpecConfig(method="ar"))
    ngram = {"ngram_min": 1, "ngram_max": 3} if proposer == "ngram" else {}  # a draft proposer refuses them
    out = llm.generate([0, 1, 2, 3], params, SpecConfig(method=method, k=6, proposal=proposer, **ngram))
    assert out.token_ids == ar.token_ids
    assert all(r.note for r in out.rounds)  # every decision is explained in the trace


def test_auto_on_a_real_model_records_its_decisions(smollm):
    ids = smollm.encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,")
    params = SamplingParams(max_new_tokens=40)
    ar = smollm.generate(ids, params, SpecConfig(method="ar"))
    auto = smollm.generate(ids, params, SpecConfig(method="auto", k=8, proposal="ngram"))
    assert auto.token_ids == ar.token_ids
    assert any(r.proposed > 0 for r in auto.rounds)  # repetitive text: speculation was tried
    assert all(r.note for r in auto.rounds)


# ---- per-position rule: drafts that carry an estimate per token ---------------
def per_position(verify: dict[int, float], **kw) -> GoodputController:
    return GoodputController(CostModel(verify_ms=dict(verify)), k_max=16, per_position=True, **kw)


def test_expected_tokens_multiplies_conditional_acceptance_along_the_block():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])


def test_a_free_proposer_drafts_k_max_and_the_prefix_is_chosen_afterwards():
    ctrl = per_position(ZEN4_VERIFY)
    assert ctrl.choose(16)[0] == 16
    assert ctrl.choose(5)[0] == 5


def test_low_estimates_verify_nothing():
    """Estimates of 0.2 never pay for a second row: K = 0 (a plain step)."""
    ctrl = per_position(ZEN4_VERIFY)
    assert ctrl.choose_prefix([0.2] * 16) == 0


def test_high_estimates_verify_the_long_block_that_is_cheaper_than_a_shorter_one():
    """v(16) < v(9): with 16 confident tokens the best block is 16 rows
    (K = 15), found on the measured curve, not by assuming v is monotonic."""
    ctrl = per_position(ZEN4_VERIFY)
    assert ctrl.cost.verify(16) < ctrl.cost.verify(9)
    assert ctrl.choose_prefix([0.97] * 16) == 15
    assert ctrl.choose_prefix([0.97] * 9 + [0.1] * 7) == 3  # a block of 9 rows never pays here


def test_the_prefix_stops_where_the_estimates_collapse():
    ctrl = per_position({b: 10.0 + b for b in range(1, 18)})  # each extra row costs little
    assert ctrl.choose_prefix([0.99] * 5 + [0.05] * 11) == 5


def test_calibration_moves_towards_the_observed_acceptance():
    cal = Calibration()
    assert cal(0.95) == pytest.approx(0.95)  # no evidence: the estimate stands
    rng = np.random.default_rng(0)
    for _ in range(300):
        cal.update(0.95, rng.random() < 0.4)
    assert cal(0.95) == pytest.approx(0.4, abs=0.1)
    assert cal(0.5) == pytest.approx(0.5)  # other buckets keep their own evidence


def test_an_overconfident_proposer_is_corrected_from_each_rounds_outcome():
    """Estimates of 0.97 whose tokens are rejected at the first position: after
    a few rounds the calibrated estimate falls and the controller stops
    verifying them, apart from one-token probes: the first after probe_every
    rounds, each failed one doubling the gap to the next, up to PROBE_BACKOFF
    times probe_every."""
    ctrl = per_position(ZEN4_VERIFY, probe_every=8)
    ks = []
    for _ in range(200):
        ctrl.choose(16)
        k = ctrl.choose_prefix([0.97] * 16)
        ks.append(k)
        ctrl.observe(RoundRecord(proposed=k, accepted=0, draft_ms=0.1, verify_ms=ctrl.cost.verify(k + 1),
                                 other_ms=0.5))
    assert ks[0] == 15
    assert ctrl.calibration(0.97) < 0.6
    assert set(ks[-100:]) <= {0, 1}
    probes = [i for i, k in enumerate(ks) if i > 0 and k == 1]
    gaps = np.diff(probes)
    assert probes[0] == 8  # then rounds 24, 56, 88, ...: gaps 16, 32, 32, ...
    assert list(gaps) == [16, 32] + [PROBE_BACKOFF * 8] * (len(gaps) - 2)
    assert "probe" in ctrl.prefix_note or ctrl.prefix_note.startswith("K=0")


def test_a_source_that_has_been_losing_must_promise_more():
    """The loss guard: while a source's recent verified rounds cost more than they gained,
    its draft is verified only if it promises LOSING_MARGIN of K = 0's rate; another
    source, and a strong draft of the losing one, are not held back."""
    ctrl = per_position(ZEN4_VERIFY)
    draft = dict(tokens=list(range(16)), at=10)
    assert ctrl.choose_prefix([0.9] * 16, source="cache", **draft) == 2  # est 1.07x of K = 0
    ctrl.observe(RoundRecord(proposed=2, accepted=0, draft_ms=0.1, verify_ms=ctrl.cost.verify(3), other_ms=0.5))
    assert ctrl.calibration.ledger["cache"] == pytest.approx(1 - ctrl.cost.verify(3) / ctrl.cost.verify(1))
    assert ctrl.calibration.losing("cache") and not ctrl.calibration.losing("own")
    assert ctrl.choose_prefix([0.9] * 16, source="cache", **draft) == 0
    assert "lost lately" in ctrl.prefix_note
    assert ctrl.choose_prefix([0.9] * 16, source="own", **draft) == 2
    assert ctrl.choose_prefix([0.97] * 16, source="cache", **draft) == 15  # est 1.53x
    ctrl.observe(RoundRecord(proposed=15, accepted=15, draft_ms=0.1, verify_ms=ctrl.cost.verify(16), other_ms=0.5))
    assert not ctrl.calibration.losing("cache")  # 16 tokens for 8.5 steps' cost: even again


def cell(cal: Calibration, c: float) -> list[float]:
    """[seen, predicted, accepted] of the calibration cell of estimate c, group 0 (no match length)."""
    return cal.cells.get((0, cal.bucket(c)), [0.0, 0.0, 0.0])


def test_only_verified_positions_update_the_calibration():
    """Accepted 2 of 5: positions 1-2 count as accepted, 3 as rejected, 4-5 unseen."""
    ctrl = per_position({b: 1.0 for b in range(1, 18)}, calibration=Calibration(decay=1.0))
    ctrl.choose(16)
    assert ctrl.choose_prefix([0.6, 0.6, 0.85, 0.92, 0.92]) == 5
    ctrl.observe(RoundRecord(proposed=5, accepted=2, draft_ms=0.0, verify_ms=1.0, other_ms=0.5))
    cal = ctrl.calibration
    assert cell(cal, 0.6)[0] == pytest.approx(2.0) and cell(cal, 0.6)[2] == pytest.approx(2.0)
    assert cell(cal, 0.85)[0] == pytest.approx(1.0) and cell(cal, 0.85)[2] == 0.0
    assert cell(cal, 0.92)[0] == 0.0


def test_every_drafted_token_is_calibrated_against_what_the_request_emitted():
    """A draft given with its tokens is calibrated whether or not it was verified:
    token j counts once tokens 1..j-1 matched and the context reaches j (accepted
    iff it matches the emitted token); after the first mismatch nothing counts."""
    ctrl = per_position(ZEN4_VERIFY, probe_every=1000, calibration=Calibration(decay=1.0))
    ctrl.choose(16)
    context = list(range(100, 110))
    assert ctrl.choose_prefix([0.6] * 5, tokens=[5, 6, 7, 8, 9], at=len(context)) == 0  # not verified
    ctrl.observe(RoundRecord(proposed=0, accepted=0, draft_ms=0.0, verify_ms=33.0, other_ms=0.5))
    cal = ctrl.calibration
    assert cell(cal, 0.6)[0] == 0.0  # observe() leaves drafts with tokens to learn()
    ctrl.learn(context + [5, 6])
    assert cell(cal, 0.6)[0] == 2.0 and cell(cal, 0.6)[2] == 2.0  # token 3's position is not emitted yet
    ctrl.learn(context + [5, 6, 7, 1, 9])
    assert cell(cal, 0.6)[0] == 4.0 and cell(cal, 0.6)[2] == 3.0  # 7 matched, 8 did not, 9 is after the mismatch
    ctrl.learn(context + [5, 6, 7, 1, 9, 9])
    assert cell(cal, 0.6)[0] == 4.0  # each position is counted once


def test_a_doubted_source_that_keeps_being_right_starts_drafting_without_probes():
    """Estimates too low to verify anything, on drafts the request then emits
    token for token: the calibration learns from the unverified drafts, so the
    controller starts verifying them although no probe ever runs."""
    ctrl = per_position(ZEN4_VERIFY, probe_every=10_000, calibration=Calibration(decay=1.0))
    text = list(range(1000))
    context, kept = text[:10], []
    while len(context) < 200:
        ctrl.choose(16)
        k = ctrl.choose_prefix([1.0] * 8, match_len=4, support=(1,) * 8,
                               tokens=text[len(context):len(context) + 8], at=len(context))
        kept.append(k)
        context = text[:len(context) + k + 1]
        ctrl.learn(context)
    assert kept[0] == 0 and kept[-1] == 3  # 4 rows cost 107 ms, 9 rows 290: K = 3 pays best
    assert "probe" not in ctrl.prefix_note


def test_a_stop_inside_the_round_is_not_counted_as_a_rejection():
    """EOS cut a fully accepted 4-token round after 2 delivered tokens: the
    verifier accepted all 4, so the estimates are credited with 4 acceptances."""
    ctrl = per_position({b: 1.0 for b in range(1, 18)}, calibration=Calibration(decay=1.0))
    ctrl.choose(16)
    assert ctrl.choose_prefix([0.95] * 4) == 4
    ctrl.observe(RoundRecord(proposed=4, accepted=2, discarded=3, draft_ms=0.0, verify_ms=1.0, other_ms=0.5))
    cal = ctrl.calibration
    cell = cal.cells[(0, cal.bucket(0.95))]
    assert cell[0] == 4.0 and cell[2] == 4.0


def test_calibration_keeps_long_matches_apart_from_short_ones():
    """Rejections of estimates made on 1-token matches must not talk down the same
    estimate made on a 16-token match: they are calibrated in different groups."""
    ctrl = per_position({b: 1.0 + 0.1 * b for b in range(1, 18)}, calibration=Calibration(decay=1.0))
    for _ in range(40):  # short matches: estimate 1.0, always rejected
        ctrl.choose(16)
        if ctrl.choose_prefix([1.0], match_len=1):
            ctrl.observe(RoundRecord(proposed=1, accepted=0, draft_ms=0.0, verify_ms=1.1, other_ms=0.5))
    assert ctrl.calibration(1.0, match_group(1)) < 0.2
    ctrl.choose(16)
    assert ctrl.choose_prefix([1.0] * 8, match_len=16) == 8  # a long match still drafts a long block


def test_drafts_from_the_own_context_and_from_the_cache_are_calibrated_apart():
    """The same estimate on the same match length: the request's own context keeps
    being copied, other requests' outputs keep being rejected. Each source learns
    its own rate, so the cache's misses do not talk down the own context's copies."""
    ctrl = per_position({b: 1.0 + 0.5 * b for b in range(1, 18)}, probe_every=1000,
                        calibration=Calibration(decay=1.0))
    for _ in range(30):
        for source, accepted in (("own", True), ("cache", False)):
            ctrl.choose(16)
            k = ctrl.choose_prefix([0.9] * 8, match_len=8, source=source)
            ctrl.observe(RoundRecord(proposed=k, accepted=k if accepted else 0, draft_ms=0.0,
                                     verify_ms=1.0 + 0.5 * (k + 1), other_ms=0.5))
    assert ctrl.calibration(0.9, match_group(8, "own")) > 0.95
    assert ctrl.calibration(0.9, match_group(8, "cache")) < 0.3  # no longer verified once K = 0
    ctrl.choose(16)
    assert ctrl.choose_prefix([0.9] * 8, match_len=8, source="own") == 8
    ctrl.choose(16)
    assert ctrl.choose_prefix([0.9] * 8, match_len=8, source="cache") == 0


def test_a_continuation_seen_once_is_a_weak_prior():
    """1 of 1 occurrences is not 9 of 9: smoothed count / (n + 1), the first
    enters the calibration as 0.5 and does not pay for a block on its own; the
    second still does. Thin evidence is calibrated in cells of its own."""
    assert smoothed_estimate(1.0, 1) == 0.5 and smoothed_estimate(1.0, 9) == pytest.approx(0.9)
    assert smoothed_estimate(0.5, 0) == 0.5
    ctrl = per_position(ZEN4_VERIFY, probe_every=1000)
    assert ctrl.choose_prefix([1.0] * 12, match_len=10, support=(1,) * 12) == 0
    assert ctrl.choose_prefix([1.0] * 16, match_len=10, support=(40,) * 16) == 15
    assert ctrl.choose_prefix([1.0] * 12, match_len=10) == 12  # no support given: the estimate stands


def test_a_fully_accepted_probe_is_followed_by_a_longer_one():
    """On copies that the prior doubts, probes double (1, 2, 4, ...) while they are
    fully accepted, so speculation comes back within a few rounds."""
    ctrl = per_position({b: 3.0 + 7 * b for b in range(1, 18)}, probe_every=4,
                        calibration=Calibration(decay=1.0))
    ks = []
    for _ in range(60):
        ctrl.choose(16)
        k = ctrl.choose_prefix([1.0] * 16, match_len=20, support=(1,) * 16)
        ks.append(k)
        ctrl.observe(RoundRecord(proposed=k, accepted=k, draft_ms=0.0, verify_ms=3.0 + 7 * (k + 1),
                                 other_ms=0.5))
    assert ks[:4] == [0, 0, 0, 1] and ks[4] == 2
    assert ks[-1] >= 8  # the calibration has learnt that these copies are accepted
