"""The controller's regression check: replayed on recorded runs, method auto's
policy must not keep less of the copy ceiling than it did when the baseline was
written (tests/fixtures/replay/baseline.json). The recorded runs: a toy run made
here (deterministic), a SmolLM2 run and a run of the shipped target, each a
bench output's streams.jsonl and copy-ceiling rows. A change that keeps more
rewrites the baseline: `python -m tests.test_replay_fixtures --write`.

Measured the bench's way (bench/analysis/replays.py, speculative/replay.py):
per category the share (speedup − 1) / (ceiling − 1); overall, the decode cost
saved over the cost the ceiling saves, summed over categories.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from speclm.backends.toy import ToyBackend
from speclm.bench.analysis.ceiling import copy_ceiling, drafter_ceiling, streams
from speclm.bench.analysis.replays import load_run, replay_run
from speclm.costs import MIN_FORWARDS
from speclm.errors import InvalidRequestError
from speclm.sampling import SamplingParams
from speclm.speculative import steps
from speclm.speculative.proposers.suffix_index import SuffixConfig
from speclm.speculative.replay import BOUNDS, POLICIES

FIXTURES = Path(__file__).parent / "fixtures" / "replay"
BASELINE = FIXTURES / "baseline.json"
TOLERANCE = 0.02  # a category may lose this much of its share if the run as a whole keeps no less
ZEN3_RATIOS = {1: 1.0, 2: 1.64, 3: 1.95, 4: 2.19, 5: 2.9, 6: 3.3, 7: 3.6, 8: 5.17, 9: 5.5, 10: 5.8, 11: 6.1,
               12: 6.4, 13: 6.9, 14: 7.4, 15: 7.9, 16: 8.27, 17: 8.6}  # v(b)/v(1) of the doctor's repack+tiled


def toy_run(out: Path) -> Path:
    """A greedy toy 'run' in the bench's format: two categories of prompts whose answers
    repeat each other (one copies a lot, one little), priced with a Zen 3 shaped curve."""
    target = ToyBackend(12, seed=7, order=3, sharpness=2.5, n_ctx=2048)
    records, ids = [], {}
    for cat, prompts in (("copy", [[0, 1, 2, 3] * 4, [1, 2, 3, 0] * 4, [2, 3, 0, 1] * 4]),
                         ("fresh", [[5, 9, 4], [7, 11, 6], [10, 8, 5]])):
        for i, prompt in enumerate(prompts):
            out_ids = steps.generate(target, None, prompt, SamplingParams(max_new_tokens=96), 0).token_ids
            ids[(cat, i)] = prompt
            records.append({"category": cat, "prompt_index": i, "token_ids": out_ids, "max_new_tokens": 96,
                            "target_name": "toy", "method": "ar", "temperature": 0.0})
    curves = {cat: {b: 100.0 * r for b, r in ZEN3_RATIOS.items()} for cat in ("copy", "fresh")}
    out.mkdir(parents=True, exist_ok=True)
    rows = copy_ceiling(records, ids, curves, k_max=16, methods=["auto"])
    (out / "summary.json").write_text(json.dumps({"copy_ceiling": rows}))
    (out / "streams.jsonl").write_text("".join(json.dumps({"target_name": "toy", **s.__dict__}) + "\n"
                                               for s in streams(records, ids)))
    return out


def recorded(tmp: Path) -> dict[str, Path]:
    """The fixture runs by name: the toy made now, the others as shipped."""
    runs = {"toy": toy_run(tmp / "toy")}
    runs.update({d.name: d for d in sorted(FIXTURES.iterdir()) if d.is_dir()} if FIXTURES.is_dir() else {})
    return runs


def kept(run_dir: Path, policy: str = "auto") -> dict[str, float]:
    """Per category (per target and category in a run of several targets) kept share, and
    'overall': Σ cost saved / Σ cost the ceiling saves."""
    rows = replay_run(run_dir, [policy])
    several = len({r["target_name"] for r in rows}) > 1  # then each category is named with its target
    out = {(f"{r['target_name']}/" if several else "") + r["category"]: r["kept_share"]
           for r in rows if r["kept_share"] is not None}
    saved = sum(r["tokens"] - r["tokens"] / r["speedup"] for r in rows)
    ceiling_saved = sum(r["tokens"] - r["tokens"] / r["ceiling"] for r in rows)
    out["overall"] = saved / ceiling_saved if ceiling_saved > 0 else 0.0
    return out


def test_auto_keeps_no_less_of_the_ceiling_than_its_baseline_on_every_recorded_run(tmp_path):
    baseline = json.loads(BASELINE.read_text())
    runs = recorded(tmp_path)
    assert set(baseline) == set(runs), "every recorded run has a baseline (--write adds one)"
    for name, run_dir in runs.items():
        now, then = kept(run_dir), baseline[name]
        assert now["overall"] >= then["overall"] - 1e-9, (name, now, then)
        for cat, share in then.items():
            assert now[cat] >= share - TOLERANCE, (name, cat, now[cat], share)


def test_the_toy_run_offers_a_ceiling_and_auto_keeps_part_of_it(tmp_path):
    shares = kept(toy_run(tmp_path / "toy"))
    assert 0.0 < shares["copy"] <= 1.0 and 0.0 < shares["overall"] <= 1.0


@pytest.mark.parametrize("policy", sorted([*POLICIES, *BOUNDS]))
def test_every_policy_replays_the_toy_run(tmp_path, policy):
    rows = replay_run(toy_run(tmp_path / "toy"), [policy])
    assert [r["category"] for r in rows] == ["copy", "fresh"]
    assert all(r["policy"] == policy and r["speedup"] > 0.5 and r["rounds"] > 0 for r in rows)


def test_a_replay_with_rematch_is_measured_against_that_drafters_ceiling(tmp_path):
    run = toy_run(tmp_path / "toy")
    recorded_rows = {c["category"]: c for c in json.loads((run / "summary.json").read_text())["copy_ceiling"]}
    for rematch, field in ((None, "drafter_ceiling"), (False, "drafter_ceiling"), (True, "rematch_ceiling")):
        for r in replay_run(run, ["auto"], rematch=rematch):
            assert r["ceiling"] == pytest.approx(recorded_rows[r["category"]][field]), (rematch, r["category"])


def test_a_run_of_two_targets_replays_each_against_its_own_ceilings(tmp_path):
    run = toy_run(tmp_path / "toy")
    rows = json.loads((run / "summary.json").read_text())["copy_ceiling"]
    streams_text = (run / "streams.jsonl").read_text()
    (run / "summary.json").write_text(json.dumps({"copy_ceiling": rows + [{**r, "target_name": "toy2"} for r in rows]}))
    (run / "streams.jsonl").write_text(streams_text + streams_text.replace('"target_name": "toy"', '"target_name": "toy2"'))
    for rematch in (None, True):
        out = replay_run(run, ["auto"], rematch=rematch)
        assert [r["target_name"] for r in out] == ["toy"] * 2 + ["toy2"] * 2
        assert [r["speedup"] for r in out[:2]] == [r["speedup"] for r in out[2:]]


def test_a_replay_can_price_the_run_by_its_own_forwards(tmp_path):
    run = toy_run(tmp_path / "toy")
    with pytest.raises(InvalidRequestError, match="no rounds.jsonl.*--costs recorded"):
        replay_run(run, ["auto"], costs="observed")
    # the requests stepped at half the timed v(1), and ran 2-row blocks at their timed price: every
    # block is twice as dear, in steps, as the timed curve said
    (run / "rounds.jsonl").write_text("".join(
        json.dumps({"target_name": "toy", "category": cat, "proposed": k, "verify_ms": ms}) + "\n"
        for cat in ("copy", "fresh") for k, ms in ((0, 50.0), (1, 164.0)) for _ in range(MIN_FORWARDS)))
    recorded_rows = replay_run(run, ["auto"])
    assert replay_run(run, ["auto"], costs="timed") == recorded_rows  # a run that stored one curve
    observed = replay_run(run, ["auto"], costs="observed")
    streams_by_target, _ = load_run(run)
    dearer = {cat: {1: 50.0, **{b: 100.0 * r for b, r in ZEN3_RATIOS.items() if b > 1}} for cat in ("copy", "fresh")}
    want = drafter_ceiling(streams_by_target["toy"], dearer, 16, SuffixConfig())
    for mine, then in zip(observed, recorded_rows):
        assert mine["ceiling"] == pytest.approx(want[mine["category"]].ceiling)
        assert mine["ceiling"] < then["ceiling"] or then["ceiling"] == pytest.approx(1.0)
    with pytest.raises(InvalidRequestError, match="unknown costs"):
        replay_run(run, ["auto"], costs="guessed")


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        table = {name: kept(d) for name, d in recorded(Path(tmp)).items()}
    BASELINE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(json.dumps(table, indent=1))
