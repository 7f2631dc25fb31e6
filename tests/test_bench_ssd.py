"""The bench's SSD figures: cache statistics per row, and the labelled projection
of SSD on its own hardware, computed from the run's measured parts."""

from __future__ import annotations

import pytest

from speclm.bench.analysis.counts import ssd_counts
from speclm.bench.analysis.groups import ssd_stats
from speclm.bench.analysis.projection import project
from speclm.bench.output.sections import lines_of
from speclm.bench.output.speculation import projection_section, ssd_section
from speclm.metrics import RoundRecord


def _rec(method, k, wall, prefill, rounds, proposed, emitted, draft, verify, other, out, **extra):
    return {"category": "humaneval", "method": method, "k": k, "temperature": 0.0, "max_new_tokens": 64,
            "prompt_index": 0, "repeat": 0, "wall_ms": wall, "prefill_ms": prefill, "output_tokens": out,
            "rounds": rounds, "proposed": proposed, "accepted": emitted - rounds, "emitted": emitted,
            "full_accepts": 0, "pos_eligible": [], "pos_accepted": [], "rejection_hist": [],
            "draft_ms": draft, "verify_ms": verify, "other_ms": other, **extra}


def test_ssd_counts_split_hits_by_outcome_and_skip_plain_rounds():
    rounds = [RoundRecord(4, 4, 1, 1, 0, info={"hit": False, "wait_ms": 100.0}),
              RoundRecord(4, 2, 1, 1, 0, info={"hit": True, "outcome_k": 4, "wait_ms": 2.0, "busy_ms": 50.0}),
              RoundRecord(4, 4, 1, 1, 0, info={"hit": False, "outcome_k": 2, "wait_ms": 80.0}),
              RoundRecord(0, 0, 0, 1, 0)]
    c = ssd_counts(rounds)
    assert c["cache_rounds"] == 3 and c["cache_hits"] == 1
    assert c["cache_hits_by_k"] == {"4": [1, 1], "2": [0, 1]}
    assert c["speculator_wait_hit_ms"] == 2.0 and c["speculator_wait_ms"] == 182.0
    assert ssd_counts([RoundRecord(2, 1, 1, 1, 0)]) == {}
    s = ssd_stats([{**c}])
    assert s["hit_rate"] == pytest.approx(1 / 3) and s["hit_rate_by_k"] == {"2": 0.0, "4": 1.0}


def test_projection_follows_its_formula_from_measured_parts():
    ar = _rec("ar", 0, 2100, 100, 40, 0, 40, 0, 2000, 0, 40)
    sd = _rec("sd-draft", 4, 1100, 100, 10, 40, 45, 400, 500, 100, 45)  # v=50, o=10, d=10 per token
    ssd = _rec("ssd", 4, 900, 100, 10, 40, 45, 300, 600, 0, 45, cache_rounds=10, cache_hits=8,
               cache_hits_by_k={}, speculator_wait_ms=300.0, speculator_wait_hit_ms=16.0, speculator_busy_ms=0.0)
    (row,) = project([ar, sd, ssd])
    round_ms = 50 + 10 + 0.8 * 2.0 + 0.2 * 4.0 * 10  # v + o + h·w_hit + (1 − h)·K̄·d
    assert row["ssd_decode_tok_s_projected"] == pytest.approx(1000 * 4.5 / round_ms)
    assert row["sd_decode_tok_s"] == pytest.approx(1000 * 45 / 1000)
    assert row["ssd_decode_tok_s_measured"] == pytest.approx(1000 * 45 / 800)
    assert row["projected_vs_ar"] == pytest.approx(row["ssd_decode_tok_s_projected"] / 20.0)
    assert row["sd_decode_tok_s_modelled"] == pytest.approx(1000 * 4.5 / (50 + 10 + 4.0 * 10))
    assert row["projected_vs_sd"] == pytest.approx(row["ssd_decode_tok_s_projected"] / row["sd_decode_tok_s_modelled"])
    text = "\n".join(lines_of(projection_section([row])))
    assert "PROJECTION, not a measurement" in text and "ssd PROJECTED" in text
    assert project([ar, sd]) == [] and lines_of(projection_section([])) == []


def test_ssd_section_appears_only_for_ssd_rows():
    row = {"category": "humaneval", "method": "ssd", "k": 4, "label": "ssd K=4", "temperature": 0.0,
           "mean_acceptance_length": 4.5,
           "ssd": {"hit_rate": 0.8, "hit_rate_by_k": {"4": 0.9}, "wait_ms_per_round": 3.0,
                   "busy_ms_per_round": 100.0}}
    assert "k=4:0.90" in "\n".join(lines_of(ssd_section([row])))
    assert lines_of(ssd_section([{**row, "ssd": None}])) == []
