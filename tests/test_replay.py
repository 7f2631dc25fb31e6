"""Replaying a greedy run through a controller without the model
(speclm/speculative/replay.py): the same rounds as the live run, priced with
the run's curve in the copy ceiling's units."""

from __future__ import annotations

import pytest

from speclm.backends.recorded import RecordedBackend
from speclm.backends.toy import ToyBackend
from speclm.costs import CostModel
from speclm.sampling import SamplingParams
from speclm.speculative import steps
from speclm.speculative.controller import Calibration, Controller, GoodputController
from speclm.speculative.proposers.suffix import SuffixProposer
from speclm.speculative.proposers.suffix_index import SuffixCache
from speclm.speculative.policies import KnownCells
from speclm.speculative.replay import Stream, replay

CURVE = {1: 10.0, 2: 12.0, 4: 15.0, 8: 22.0, 16: 40.0, 17: 43.0}
PROMPTS = [[0, 1, 2, 3], [3, 2, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4], [5, 0, 1, 2]]


def live_run(max_new: int = 48) -> tuple[list[Stream], list[int]]:
    """A greedy auto run on a peaked toy model: each request's output and every round's K."""
    target = ToyBackend(6, seed=3, order=2, sharpness=3.0)
    cache, calibration, ks, streams = SuffixCache(10_000), Calibration(), [], []
    for prompt in PROMPTS:
        ctrl = GoodputController(CostModel(verify_ms=dict(CURVE), weight=0.0), k_max=16, calibration=calibration,
                                 per_position=True)
        res = steps.generate(target, SuffixProposer(cache), prompt, SamplingParams(max_new_tokens=max_new), 16,
                             controller=ctrl)
        streams.append(Stream("toy", prompt, res.token_ids, max_new))
        ks += [r.proposed for r in res.rounds]
    return streams, ks


def test_the_replay_makes_the_live_controllers_decisions_exactly():
    streams, live_ks = live_run()
    assert any(live_ks), "the run must have drafted for this to say anything"
    (row,) = replay(streams, {"toy": CURVE}, keep_ks=True)
    assert row.ks == live_ks
    assert row.tokens == sum(len(s.output) for s in streams)


def test_a_controller_that_never_drafts_replays_at_exactly_plain_decodings_cost():
    streams, _ = live_run()
    never_drafts = type("Never", (Controller,), {"choose": lambda self, cap: (0, None)})
    never = lambda cost, calibration, k_max, shared: never_drafts()
    (row,) = replay(streams, {"toy": CURVE}, policy=never)
    assert row.cost == row.tokens == row.rounds and row.speedup == 1.0 and row.verified == 0
    assert row.kept_share(ceiling=1.5) == 0.0 and row.kept_share(ceiling=1.0) is None


def test_auto_keeps_a_share_of_the_gain_between_nothing_and_everything():
    streams, _ = live_run()
    (row,) = replay(streams, {"toy": CURVE})
    assert row.accepted > 0 and 1.0 < row.speedup < row.tokens / row.rounds + 1


def test_the_recorded_backend_emits_its_recording_and_accepts_only_what_it_holds():
    backend = RecordedBackend(vocab_size=10, eos_id=9)
    backend.expect([1, 2], [3, 4, 5])
    seq = backend.new_sequence()
    assert backend.prefill(seq, [1]).argmax() == 2
    rows = backend.score(seq, [2, 3, 7])  # the recording goes 2 -> 3 -> 4; 7 was never there
    assert list(rows.argmax(axis=1)) == [3, 4, 5]
    backend.rollback(seq, 3)
    assert backend.score(seq, [4, 5]).argmax(axis=1).tolist() == [5, 9]  # after the recording: end of text
    with pytest.raises(KeyError, match="no recording"):
        RecordedBackend(vocab_size=10, eos_id=9).new_sequence()


# ---- the offline policies (speculative/policies.py) --------------------------------
def test_run_lengths_trust_a_cell_only_with_evidence_and_never_rise_with_the_position():
    from speclm.speculative.policies import RunLengths
    runs = RunLengths(k_max=4, decay=1.0, min_evidence=3.0)
    cell = ("own", 3, 2)
    assert runs.survival(cell, [0.9, 0.5, 0.2]) == [0.9, 0.5, 0.2]  # no evidence: the fallback
    for matched in (4, 4, 1):  # two drafts matched all 4 tokens, one only its first
        runs.update(cell, matched, min(matched + 1, 4))
    s = runs.survival(cell, [0.9, 0.5, 0.2, 0.1])  # positions 3 and 4: 2 drafts known < 3
    assert s[:2] == [1.0, 2 / 3] and s[2:] == pytest.approx([2 / 3 * 0.2 / 0.5, 2 / 3 * 0.1 / 0.5])
    runs.update(cell, 0, 1)
    assert runs.survival(cell, [0.95, 0.9, 0.9, 0.9])[0] == 0.75  # 3 of 4 first tokens matched
    assert runs.survival(("cache", 3, 2), [0.4]) == [0.4]  # cells are apart


def test_the_run_length_policy_replays_every_request_to_its_recorded_output():
    from speclm.speculative.replay import POLICIES
    streams, _ = live_run(96)
    (auto,) = replay(streams, {"toy": CURVE})
    (runs,) = replay(streams, {"toy": CURVE}, policy=POLICIES["runlength"])
    assert runs.tokens == auto.tokens and runs.accepted > 0 and runs.speedup > 1.0


def test_known_cells_answer_each_cell_with_its_counted_rate_and_learn_nothing():
    learnt = Calibration(decay=1.0)
    for ok in (True, True, True, False):
        learnt.update(0.5, ok, ("own", 2))
    known = KnownCells(learnt)
    assert known(0.5, ("own", 2)) == pytest.approx(0.75)
    assert known(0.5, ("cache", 2)) == 0.5  # a cell never seen: the estimate as it is
    known.update(0.5, False, ("own", 2))
    known.record_net("own", -10.0)
    assert known(0.5, ("own", 2)) == pytest.approx(0.75) and not known.losing("own")
