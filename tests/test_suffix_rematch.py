"""Suffix drafting with rematch (--suffix-rematch): a draft whose source runs out
before k tokens goes on from a new match of the context plus the draft so far,
in whichever source matches it best, so one draft can follow an answer that
copies from several places (a JSON scaffold from earlier outputs, a value from
the document). Each token names its origin, and the controller calibrates it
there. Losslessness (greedy identity, the sampling harness with the cache
filled) is in test_suffix.py, beside the single-source drafter's."""

from __future__ import annotations

import numpy as np
import pytest

from speclm.costs import CostModel
from speclm.sampling import SamplingParams
from speclm.speculative import steps
from speclm.speculative.controller import Calibration, GoodputController
from speclm.speculative.proposers.suffix import SuffixProposer
from speclm.speculative.proposers.suffix_index import SuffixCache, SuffixConfig

from speclm.backends.toy import ToyBackend

GREEDY = SamplingParams()
REMATCH = SuffixConfig(rematch=True)
SCAFFOLD = [5, 6, 7, 8]  # an earlier request: after 5 6 came 7 8, and it ended there
CONTEXT = [7, 8, 30, 31, 32, 33, 40, 41, 42, 43, 44, 45, 5, 6]  # the request: 7 8 was followed by 30 31 32 33 ...


def draft(config: SuffixConfig, k: int = 6, context: list[int] = CONTEXT):
    cache = SuffixCache()
    cache.add(SCAFFOLD)
    proposer = SuffixProposer(cache, config)
    return proposer, proposer.propose(context, k, GREEDY, np.random.default_rng(0))


def test_a_draft_goes_on_from_the_request_where_the_cache_runs_out():
    proposer, d = draft(REMATCH)
    assert d.tokens == [7, 8, 30, 31, 32, 33]
    assert [src for src, _ in d.origins] == ["cache"] * 2 + ["own"] * 4
    assert proposer.round_info()["segments"][:2] == ["cache", "own"]


def test_without_rematch_the_draft_stops_where_its_source_does():
    _, d = draft(SuffixConfig())
    assert d.tokens == [7, 8] and d.origins is None


def test_each_token_names_the_match_its_estimate_rests_on():
    _, d = draft(REMATCH)
    cache_matches = [m for src, m in d.origins if src == "cache"]
    own_matches = [m for src, m in d.origins if src == "own"]
    assert cache_matches == [2, 3]  # "5 6" matched in the cache, then one drafted token deeper
    assert own_matches[0] >= 2 and own_matches == sorted(own_matches)  # "7 8" matched in the request, then deeper


def test_never_drafts_more_than_k():
    for k in range(1, 10):
        _, d = draft(REMATCH, k=k)
        assert len(d.tokens) == min(k, 14) and len(d.confidence) == len(d.support) == len(d.origins or d.tokens)


def test_a_generation_never_drafts_past_the_requests_room():
    """A toy target whose greedy text repeats (so drafts run long), max_new_tokens 7: no round
    drafts beyond the tokens still allowed, and the output is plain decoding's."""
    target = ToyBackend(6, seed=3, order=2, sharpness=3.0)
    cache = SuffixCache()
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    full = steps.generate(target, None, prompt, SamplingParams(max_new_tokens=40), 0).token_ids
    cache.add(prompt + full)
    for n in (1, 3, 7):
        params = SamplingParams(max_new_tokens=n)
        out = steps.generate(target, SuffixProposer(cache, REMATCH), prompt, params, 16)
        assert out.token_ids == full[:n]
        emitted = 0
        for r in out.rounds:
            assert r.proposed <= n - emitted - 1, (n, emitted, r.proposed)
            emitted += r.accepted + 1


def test_the_controller_calibrates_each_token_in_its_origins_cells():
    _, d = draft(REMATCH)
    cost = CostModel(verify_ms={b: 1.0 + 0.1 * b for b in range(1, 18)}, weight=0.0)
    calibration = Calibration()
    ctrl = GoodputController(cost, k_max=16, calibration=calibration, per_position=True)
    ctrl.keep(d, len(CONTEXT))
    ctrl.learn(CONTEXT + [7, 8, 30, 31, 32, 99])  # the answer took five of the six drafted tokens
    groups = {group for group, _ in calibration.cells}
    assert {g[0] for g in groups} == {"cache", "own"}
    def counted(source: str) -> tuple[float, float]:  # (positions seen, accepted), decayed within a cell
        cells = [cell for (g, _), cell in calibration.cells.items() if g[0] == source]
        return sum(c[0] for c in cells), sum(c[2] for c in cells)
    assert counted("cache") == pytest.approx((2, 2), abs=0.05)  # 7 8: both taken
    assert counted("own") == pytest.approx((4, 3), abs=0.05)  # 30 31 32 taken, 33 not
