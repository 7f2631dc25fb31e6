"""Metric definitions of the design note §2 on hand-made traces."""

from __future__ import annotations

import pytest

from speclm.metrics import RoundRecord, summarize


def r(k, a):
    return RoundRecord(proposed=k, accepted=a, draft_ms=1.0, verify_ms=2.0, other_ms=0.5)


def test_summary_follows_the_definitions():
    rounds = [r(4, 4), r(4, 1), r(4, 0), r(2, 2)]
    s = summarize(rounds, output_tokens=11, wall_ms=22.0, ttft_ms=2.0)
    assert s.acceptance_rate == pytest.approx(7 / 14)
    assert s.mean_acceptance_length == pytest.approx((5 + 2 + 1 + 3) / 4)
    # position j: rounds with a >= j over rounds with K >= j
    assert s.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])
    assert s.accepted_progress_per_ms == pytest.approx(11 / 22)
    assert s.tpot_ms == pytest.approx(20 / 10)
    assert [x.rejection_position for x in rounds] == [None, 2, 1, None]
    assert s.draft_ms == 4.0 and s.verify_ms == 8.0


def test_plain_decoding_has_no_acceptance_rate():
    s = summarize([r(0, 0)] * 3, output_tokens=3, wall_ms=3.0, ttft_ms=1.0)
    assert s.acceptance_rate is None and s.mean_acceptance_length == 1.0
    assert s.per_position_acceptance == []


# ---- delivered accounting: a stop inside a round -------------------------------------
def test_a_cut_round_counts_only_delivered_tokens():
    """K = 4 all accepted, but a stop string completes on the 2nd draft token:
    2 delivered (accepted = emitted = 2), 3 discarded (2 drafts + the bonus);
    the verifier still accepted all 4, so there was no rejection."""
    cut = RoundRecord(proposed=4, accepted=2, draft_ms=1.0, verify_ms=2.0, other_ms=0.5, discarded=3)
    assert (cut.emitted, cut.verified, cut.rejection_position) == (2, 4, None)
    d = cut.to_dict()
    assert (d["emitted"], d["verified"], d["discarded"]) == (2, 4, 3)


def test_eos_as_the_correction_is_discarded_but_the_rejection_stays():
    """Draft 2 rejected and the correction is EOS: 1 token delivered, the EOS
    token discarded, rejection at position 2."""
    eos = RoundRecord(proposed=4, accepted=1, draft_ms=1.0, verify_ms=2.0, other_ms=0.5, discarded=1)
    assert (eos.emitted, eos.verified, eos.rejection_position) == (1, 1, 2)


def test_summary_counts_delivered_and_discarded_separately():
    """Acceptance rate and mean acceptance length use delivered counts;
    discarded tokens are summed on their own."""
    rounds = [r(4, 4), RoundRecord(4, 2, 1.0, 2.0, 0.5, discarded=3)]
    s = summarize(rounds, output_tokens=7, wall_ms=7.0, ttft_ms=1.0)
    assert s.accepted == 6 and s.discarded == 3
    assert s.acceptance_rate == pytest.approx(6 / 8)
    assert s.mean_acceptance_length == pytest.approx(7 / 2)
    assert s.per_position_acceptance == pytest.approx([1.0, 1.0, 0.5, 0.5])


def _cut_runs(**params_kw) -> list:
    """Sampled generations whose draft is the target itself (q = p: every draft
    token is accepted), so EOS or a stop string mostly lands inside a round."""
    from speclm.backends.toy import ToyBackend
    from speclm.sampling import SamplingParams
    from speclm.speculative import steps
    from speclm.speculative.proposers.draft_model import DraftModelProposer

    target = ToyBackend(6, seed=3, order=2, eos_id=params_kw.pop("eos_id", None))
    draft = ToyBackend(6, seed=3, order=2)
    return [steps.generate(target, DraftModelProposer(draft), [0, 1, 2],
                          SamplingParams(temperature=1.0, seed=i, max_new_tokens=40, **params_kw), 6)
            for i in range(60)]


@pytest.mark.parametrize("params_kw", [dict(eos_id=5), dict(stop=("ab", "fc"))], ids=["eos", "stop"])
def test_delivered_counts_add_up_to_the_output(params_kw):
    """Σ emitted over rounds == len(token_ids) and the summary's accepted and
    discarded are the rounds' sums, for every generation; each round's
    delivered + discarded tokens are its verified drafts + 1; some rounds
    really were cut (discarded > 0)."""
    results = _cut_runs(**params_kw)
    for res in results:
        assert sum(x.emitted for x in res.rounds) == len(res.token_ids) == res.summary.output_tokens
        assert res.summary.accepted == sum(x.accepted for x in res.rounds)
        assert res.summary.discarded == sum(x.discarded for x in res.rounds)
        assert all(x.emitted + x.discarded == x.verified + 1 for x in res.rounds)
        assert all(x.discarded == 0 for x in res.rounds[:-1])  # only the last round can be cut
    assert sum(res.summary.discarded > 0 for res in results) > 10


def test_max_new_tokens_never_discards():
    """The loop never drafts past max_new_tokens, so a length limit cuts no round."""
    for res in _cut_runs():
        assert res.finish_reason == "length" and res.summary.discarded == 0
        assert sum(x.emitted for x in res.rounds) == len(res.token_ids) == 40
