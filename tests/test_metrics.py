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
