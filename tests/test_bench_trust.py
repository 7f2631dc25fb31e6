"""Can a bench result be trusted? Contamination (requests starved of CPU by another
process: flagged, re-run with their AR partner, bounded, reported), fresh prompts
for every phase (a server that keeps what it was sent is never timed replaying it
unflagged) and no more requests in flight than a row has, and honest ratios (time
per token, prefill and decode apart, the Σ-wall ratio only over outputs of equal
length). Synthetic numbers pin the rules; the toy model with a
scripted CPU clock pins the re-run bookkeeping exactly; SmolLM2 beside real
busy-loop processes shows the check firing on a real starvation."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from speclm import LLM
from speclm.backends.toy import ToyBackend
from speclm.bench.pipeline import run_pipeline
from speclm.bench.setup.plan import plan_bench
from speclm.commands import bench as bench_cli
from speclm.bench.analysis.counts import round_counts
from speclm.bench.analysis.groups import group_rows, verdicts
from speclm.bench.analysis.ratios import pair_with_ar, speedup_stats
from speclm.bench.output.results import MAIN_HEADER, identity_note, table_rows
from speclm.bench.setup import workloads
from speclm.bench.setup.config import BenchConfig, make_arms
from speclm.bench.run.sequential import run_bench
from speclm.bench.trust import phases, starvation
from speclm.bench.trust.policy import TrustPolicy
from speclm.bench.trust.quiet import wait_for_quiet
from speclm.bench.trust.starvation import starved


# ---- the flagging rule -----------------------------------------------------------
def test_a_request_is_starved_below_the_share_of_the_threads_it_computes_with():
    # 2 threads on 2 cores: a quiet request gets ~2 CPU s per wall s; 0.6 × 2 = 1.2 is the line
    assert starved(cpu_s=1.9, wall_s=1.0, threads=2, min_share=0.6, cores=2) is None
    assert starved(cpu_s=1.2, wall_s=1.0, threads=2, min_share=0.6, cores=2) is None  # at the line: not below
    why = starved(cpu_s=0.8, wall_s=1.0, threads=2, min_share=0.6, cores=2)
    assert why == "CPU share 0.80 < 0.6 × 2 threads: starved by another process"
    # more threads than cores cannot get more than the cores: judged against min(threads, cores)
    assert starved(cpu_s=1.5, wall_s=1.0, threads=8, min_share=0.6, cores=2) is None
    one = starved(cpu_s=0.5, wall_s=1.0, threads=1, min_share=0.6, cores=2)
    assert one.startswith("CPU share 0.50 < 0.6 × 1 thread:")
    # nothing to judge by: no thread count (toy backends), no wall time, the check turned off
    assert starved(0.0, 1.0, None, 0.6, 2) is None
    assert starved(0.0, 0.0, 2, 0.6, 2) is None
    assert starved(0.0, 1.0, 2, 0.0, 2) is None


def test_bad_thresholds_are_one_line_errors_naming_the_flag():
    from speclm.errors import InvalidRequestError
    for kw, flag in (({"min_share": 1.5}, "--min-cpu-share"), ({"max_reruns": -1}, "--max-reruns"),
                     ({"wait_quiet_s": -1}, "--wait-quiet")):
        with pytest.raises(InvalidRequestError, match=flag):
            TrustPolicy(**kw)
    assert TrustPolicy().total_cap(40) == 20 and TrustPolicy().total_cap(2) == 4
    assert TrustPolicy(max_total_reruns=0).total_cap(40) == 0


class FakeTime:
    """A clock, a sleep that advances it, and busy CPUs read from a script."""

    def __init__(self, loads):
        self.now, self.loads, self.slept, self.notes = 0.0, list(loads), [], []

    def busy(self):
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_wait_for_quiet_samples_until_the_machine_is_quiet_and_is_bounded_in_time():
    t = FakeTime([1.8, 1.4, 0.7])
    policy = TrustPolicy(wait_quiet_s=60, poll_s=5, notify=lambda text: t.notes.append(text))
    got = wait_for_quiet(policy, cores=2, busy=t.busy, sleep=t.sleep, clock=lambda: t.now)
    assert got["quiet"] and got["threshold"] == 1.0 and got["waited_s"] == 10
    assert got["loads"] == [[0.0, 1.8], [5.0, 1.4], [10.0, 0.7]]
    assert len(t.notes) == 1 and "waiting up to 60 s" in t.notes[0] and "--no-wait-quiet" in t.notes[0]
    t = FakeTime([3.0])  # never quiet: gives up after the bound, having slept no longer than it
    got = wait_for_quiet(TrustPolicy(wait_quiet_s=12, poll_s=5, quiet_load=1.5), 2, t.busy, t.sleep, lambda: t.now)
    assert not got["quiet"] and got["waited_s"] == 12 and t.slept == [5, 5, 2] and got["threshold"] == 1.5
    t = FakeTime([3.0])  # --no-wait-quiet: one reading, no sleep
    got = wait_for_quiet(TrustPolicy(wait_quiet_s=0), 2, t.busy, t.sleep, lambda: t.now)
    assert not got["quiet"] and t.slept == [] and got["loads"] == [[0.0, 3.0]]


# ---- re-runs, exactly: the toy model and a scripted CPU clock ----------------------------------
class ScriptedCpu:
    """starvation.cpu_clock for the toy: each request reads it twice (start, end); the
    end reading makes the request starved (0 CPU seconds) when the script says so."""

    def __init__(self, starved_calls: set[int]):
        self.starved_calls, self.calls, self.reads = starved_calls, 0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2:
            return 0.0
        self.calls += 1
        return 0.0 if self.calls in self.starved_calls else 1e6


def toy_run(tmp_path, monkeypatch, starved_calls, methods=("sd-ngram",), name="out", **trust):
    monkeypatch.setattr(starvation, "cpu_clock", ScriptedCpu(set(starved_calls)))
    target = ToyBackend(6, seed=4, n_ctx=256)
    target.n_threads = 1  # judged as a one-thread backend
    prompts = [workloads.Prompt("seq", i, p, chat=False) for i, p in enumerate(
        [(0, 1, 2, 0, 1, 2), (1, 2, 3, 1, 2, 3), (2, 3, 4, 2, 3, 4)])]
    cfg = BenchConfig(methods=list(methods), ks=[2], max_new_tokens=[8], trust=TrustPolicy(**trust))
    out = run_pipeline(plan_bench(prompts, cfg, LLM(target=target)), tmp_path / name, progress=False)

    def lines(file: str) -> list[dict]:
        path = tmp_path / name / file
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return out, lines("requests.jsonl"), lines("reruns.jsonl")


def test_starved_requests_are_rerun_with_their_ar_partner_after_the_sweep(tmp_path, monkeypatch):
    # run order: 1 ar#0, 2 ng#0, 3 ar#1, 4 ng#1, 5 ar#2, 6 ng#2; then pass 1: 7 ar#0, 8 ng#0, 9 ar#1;
    # pass 2: 10 ar#0, 11 ng#0. Starved: ng#0 (call 2) and again on its first re-run (8); ar#1 (3).
    out, requests, reruns = toy_run(tmp_path, monkeypatch, {2, 3, 8}, max_total_reruns=10)
    assert [(r["prompt_index"], r["method"], r["attempt"]) for r in requests] == [
        (0, "ar", 2), (0, "sd-ngram", 2), (1, "ar", 1), (1, "sd-ngram", 0), (2, "ar", 0), (2, "sd-ngram", 0)]
    assert not any(r["starved"] for r in requests)  # the kept attempts are clean
    by_id = {r["request_id"]: r for r in requests}
    ng0, ar0, ar1 = by_id["r00002"], by_id["r00001"], by_id["r00003"]
    assert [a["starved"] is not None for a in ng0["earlier_attempts"]] == [True, True]
    assert ar0["rerun_reason"] == "AR partner of r00002" and ng0["rerun_reason"].startswith("starved: CPU share 0.00")
    assert ar1["rerun_reason"].startswith("starved:") and len(ar1["earlier_attempts"]) == 1
    # every superseded attempt is in reruns.jsonl, in the order it was replaced
    assert [(r["request_id"], r["attempt"]) for r in reruns] == [
        ("r00001", 0), ("r00002", 0), ("r00003", 0), ("r00001", 1), ("r00002", 1)]
    c = out["summary"]["contamination"]
    assert (c["checked"], c["flagged"], c["reruns"], c["rerun_requests"], c["recovered"]) == (6, 2, 5, 3, 2)
    assert c["reruns_by_reason"] == {"AR partner": 2, "starved": 3} and c["still_starved"] == []
    assert c["rerun_cap"] == 10 and c["flagged_ids"] == ["r00002", "r00003"]
    assert sum(r["attempt"] for r in requests) == c["reruns"] == len(reruns)
    assert not any("still starved" in w for w in out["summary"]["warnings"])
    md = out["report"].read_text()
    assert "## Contamination (CPU starvation) and re-runs" in md
    assert "**2 of 6 checked requests starved of CPU (share < 0.6 × threads); 5 re-run generations " \
           "(2 AR partner, 3 starved; cap 10), 2 recovered, 0 still starved.**" in md
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    trust = manifest["contamination"]
    assert trust["min_cpu_share"] == 0.6 and len(trust["observed"]["reruns"]) == 5
    assert manifest["config"]["contamination"] == {k: v for k, v in trust.items() if k != "observed"}


def test_reruns_stop_at_the_per_request_bound_and_the_run_cap(tmp_path, monkeypatch):
    # --max-reruns 1: ng#0 starved on its only re-run stays starved, and is reported as such
    out, requests, reruns = toy_run(tmp_path, monkeypatch, {2, 8}, max_reruns=1)
    ng0 = next(r for r in requests if r["request_id"] == "r00002")
    assert ng0["starved"] and ng0["attempt"] == 1 and len(reruns) == 2
    c = out["summary"]["contamination"]
    assert [(s["request_id"], s["why_not_rerun"]) for s in c["still_starved"]] == [
        ("r00002", "starved on all 1 re-runs")]
    assert any("1 request still starved of CPU after re-runs" in w for w in out["summary"]["warnings"])
    # a cap of 2 generations: ar#0 + ng#0 use it, ar#1 (starved alone) is left as it was
    out, requests, reruns = toy_run(tmp_path, monkeypatch, {2, 3}, name="capped", max_total_reruns=2)
    c = out["summary"]["contamination"]
    assert c["reruns"] == 2 and c["rerun_cap"] == 2 and len(reruns) == 2
    assert [(s["request_id"], s["why_not_rerun"]) for s in c["still_starved"]] == [
        ("r00003", "not re-run further: the run's re-run cap (2) was reached")]
    # --max-reruns 0: flagged, never re-run
    out, requests, reruns = toy_run(tmp_path, monkeypatch, {2}, name="none", max_reruns=0)
    assert reruns == [] and out["summary"]["contamination"]["still_starved"][0]["why_not_rerun"] == \
        "not re-run: --max-reruns is 0"


def test_a_method_that_learns_across_requests_is_flagged_but_never_replayed(tmp_path, monkeypatch):
    # sd-suffix's shared cache already holds prompt 0's first output: a re-run would replay it
    out, requests, reruns = toy_run(tmp_path, monkeypatch, {2}, methods=("sd-suffix",))
    assert reruns == [] and requests[1]["method"] == "sd-suffix" and requests[1]["starved"]
    (left,) = out["summary"]["contamination"]["still_starved"]
    assert left["why_not_rerun"].startswith("not re-run: the method learns across requests")


# ---- fresh prompts per phase, and N never above the requests a row has ----------------------------
def prompt_set(**per_category: int) -> list[workloads.Prompt]:
    return [workloads.Prompt(c, i, f"{c} prompt {i}", chat=True) for c, n in per_category.items() for i in range(n)]


def names(prompts) -> list[str]:
    return [f"{p.category}{p.index}" for p in prompts]


def test_a_server_that_keeps_what_it_is_sent_gets_prompts_of_its_own_in_every_phase():
    """Every category holds a prompt per phase: each phase takes a contiguous run of every
    category, so no prompt reaches the server twice and nothing is flagged."""
    prompts = prompt_set(a=6, b=7)
    passes, rows = phases.plan(prompts, BenchConfig(concurrency=[1, 4]), forgets=False)
    assert [names(p.prompts) for p in passes + rows] == [
        ["a0", "a1", "b0", "b1"], ["a2", "a3", "b2", "b3"], ["a4", "a5", "b4", "b5", "b6"]]
    assert sorted(names(q for p in passes + rows for q in p.prompts)) == sorted(names(prompts))
    assert not any(p.replay for p in passes + rows) and [(r.n_asked, r.n) for r in rows] == [(1, 1), (4, 4)]
    assert phases.warnings(passes + rows) == []
    # repeats are phases too: two passes, two halves
    passes, rows = phases.plan(prompt_set(a=4), BenchConfig(repeats=2), forgets=False)
    assert [names(p.prompts) for p in passes] == [["a0", "a1"], ["a2", "a3"]] and rows == []


def test_six_prompts_at_concurrency_16_run_as_6_in_flight_every_later_phase_flagged_a_replay():
    """3 phases but 2 prompts a category: no split gives every phase every category, so each
    phase sends the whole set, the phases after the first flagged; the 16 row has 6 requests."""
    prompts = prompt_set(a=2, b=2, c=2)
    passes, rows = phases.plan(prompts, BenchConfig(concurrency=[1, 16]), forgets=False)
    assert all(p.prompts == tuple(prompts) for p in passes + rows)
    assert [p.replay for p in passes + rows] == [False, True, True]
    assert [(r.n_asked, r.n) for r in rows] == [(1, 1), (16, 6)]
    assert rows[1].name.startswith("concurrency N=6 (16 asked)")
    assert rows[1].to_dict()["concurrency"] == 6 and rows[1].to_dict()["concurrency_requested"] == 16
    replay, capped = phases.warnings(passes + rows)
    assert replay.startswith("2 of 3 phases resend prompts their server was sent earlier in this run")
    assert capped == "--concurrency 16 ran as N = 6: a row has only 6 prompts, so no more requests were in flight"


def test_in_process_every_phase_sends_every_prompt_in_cache_scopes_of_its_own():
    prompts = prompt_set(a=2, b=1)
    passes, rows = phases.plan(prompts, BenchConfig(repeats=2, concurrency=[1, 16]), forgets=True)
    assert all(p.prompts == tuple(prompts) and not p.replay for p in passes + rows)
    assert [(r.n_asked, r.n) for r in rows] == [(1, 1), (16, 3)]
    scopes = [p.scope(arm) for p in passes + rows for arm in (0, 1)]
    assert len(set(scopes)) == len(scopes)  # no phase, no arm finds another's caches


def test_a_repeat_learns_the_sequence_anew_instead_of_replaying_the_pass_before():
    """sd-suffix drafts from what its cache saw. Each pass runs in a scope of its own, so the
    second repeat drafts exactly as the first did (greedy, a deterministic toy); sharing one
    cache, it would draft the first repeat's answers back to it."""
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128))
    prompts = [workloads.Prompt("seq", i, (0, 1, 2, i, 1, 2), chat=False) for i in range(3)]
    cfg = BenchConfig(methods=["sd-suffix"], ks=[3], max_new_tokens=[12], repeats=2)
    run = run_bench(llm, prompts, cfg, make_arms(cfg, llm))
    suffix = {(r["repeat"], r["prompt_index"]): (r["proposed"], r["accepted"]) for r in run.requests
              if r["method"] == "sd-suffix"}
    assert all(suffix[(1, i)] == suffix[(0, i)] for i in range(3))
    stats = llm.suffix_cache_stats()
    assert all(stats[f"bench-arm1-T0-n12-r{rep}"]["added_requests"] == 3 for rep in (0, 1))


def test_an_in_process_concurrency_row_never_has_more_in_flight_than_its_prompts(tmp_path):
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128), max_sequences=3)
    prompts = [workloads.Prompt("t", i, (0, 1, 2, i, 1), chat=False) for i in range(3)]
    cfg = BenchConfig(methods=["sd-ngram"], ks=[2], max_new_tokens=[8], concurrency=[1, 16])
    out = run_pipeline(plan_bench(prompts, cfg, llm), tmp_path / "out", progress=False)
    conc = out["summary"]["concurrency"]
    assert [(c["concurrency_requested"], c["concurrency"]) for c in conc] == [(1, 1)] * 2 + [(16, 3)] * 2
    assert all(1 <= c["in_flight_peak"] <= c["concurrency"] for c in conc)
    assert all(c["ttft_first_wave_ms"]["n"] == 3 and c["ttft_steady_ms"]["n"] == 0 for c in conc[2:])
    assert "--concurrency 16 ran as N = 3: a row has only 3 prompts" in " ".join(out["summary"]["warnings"])
    assert [e["concurrency"] for e in out["summary"]["concurrency_paired"]] == [1, 1, 3, 3]
    md = out["report"].read_text()
    assert "| 3 (16 asked) |" in md and "--concurrency 16 ran as N = 3" in md


# ---- the real thing: SmolLM2 beside busy loops --------------------------------------------------
def test_smollm_requests_starved_by_busy_loops_are_flagged_and_rerun(tmp_path, capsys, monkeypatch):
    """Two busy-loop processes share the 2 cores with a one-thread SmolLM2 bench: its requests
    get at most 2/3 of a CPU second per wall second (less when the machine is busier still),
    against ~1 on a quiet machine, so --min-cpu-share 0.9 flags them whatever else runs here.
    Each flagged request is re-run (at most once here) with its AR partner, and the books
    balance whatever the re-runs find."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "hog"
    parser = argparse.ArgumentParser(prog="speclm")
    bench_cli.add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([
        "bench", "--target", "smollm2-135m", "--threads", "1", "--methods", "ar,sd-ngram", "--k", "3",
        "--categories", "chat", "--prompts-per-category", "1", "--max-new-tokens", "8",
        "--no-wait-quiet", "--min-cpu-share", "0.9", "--max-reruns", "1", "--out", str(out)])
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert args.func(args) == 0
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    requests = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    reruns_file = out / "reruns.jsonl"
    superseded = [json.loads(x) for x in reruns_file.read_text().splitlines()] if reruns_file.exists() else []
    summary = json.loads((out / "summary.json").read_text())
    c = summary["contamination"]
    assert [r["method"] for r in requests] == ["ar", "sd-ngram"] and all(r["threads"] == 1 for r in requests)
    assert c["checked"] == 2 and c["flagged"] > 0 and c["reruns"] > 0
    # bookkeeping: every re-run is one superseded attempt; at most --max-reruns per request, the cap in all
    assert c["reruns"] == len(superseded) == sum(r["attempt"] for r in requests) <= c["rerun_cap"]
    assert all(r["attempt"] <= 1 and len(r["earlier_attempts"]) == r["attempt"] for r in requests)
    assert all(s["starved"] for s in superseded if s["method"] != "ar")  # a method re-runs only when starved
    assert sorted(s["request_id"] for s in c["still_starved"]) == sorted(r["request_id"] for r in requests
                                                                        if r["starved"])
    assert c["flagged"] == c["recovered"] + len(c["still_starved"])
    console = capsys.readouterr().out
    assert f"contamination: {c['flagged']} of 2 checked requests starved of CPU (share < 0.9 × threads)" in console
    assert "## Contamination (CPU starvation) and re-runs" in (out / "report.md").read_text()


# ---- honest ratios ----------------------------------------------------------------------
def rec(method, prompt, wall, tokens, prefill, prompt_tokens=20, category="c", identical=None):
    return {"request_id": f"{method}{prompt}", "category": category, "method": method, "k": 0 if method == "ar" else 4,
            "prompt_index": prompt, "repeat": 0, "temperature": 0.7, "max_new_tokens": 16, "wall_ms": wall,
            "prefill_ms": prefill, "prompt_tokens": prompt_tokens, "output_tokens": tokens,
            "tokens_per_s": 1000 * tokens / wall, "ttft_ms": prefill, "tpot_ms": 1.0, "draft_ms": 0.0,
            "verify_ms": 0.0, **round_counts([]),
            "identity": None if identical is None else {"identical": identical, "compared_tokens": tokens,
                                                       "first_divergence": None, "ar_top2_margin": None}}


def test_ratios_are_per_token_and_the_wall_ratio_needs_equal_lengths():
    # prompt 0: the method stops after 5 tokens where AR wrote 10, in 60 ms against 100:
    # Σ wall says 1.67×, but per output token it is 12 ms against 10 ms: 0.83×, slower.
    # prompt 1: equal lengths, 2× faster.
    recs = [rec("ar", 0, 100.0, 10, 20.0), rec("sd", 0, 60.0, 5, 10.0),
            rec("ar", 1, 80.0, 8, 16.0), rec("sd", 1, 40.0, 8, 16.0)]
    pairs = pair_with_ar(recs)
    first = speedup_stats(pairs[:1])
    assert first["speedup"] == pytest.approx(10.0 / 12.0)
    assert first["decode_speedup"] == pytest.approx((80 / 10) / (50 / 5))  # (wall − prefill) per output token
    assert first["prefill_speedup"] == pytest.approx((20 / 20) / (10 / 20))  # prefill ms per prompt token
    assert first["wall_speedup"] is None and (first["same_length"], first["pairs"]) == (0, 1)
    both = speedup_stats(pairs)
    assert both["speedup"] == pytest.approx((180 / 18) / (100 / 13))
    assert both["wall_speedup"] == pytest.approx(80 / 40) and (both["same_length"], both["pairs"]) == (1, 2)
    assert both["speedup_dist"]["min"] == pytest.approx(10 / 12) and both["speedup_dist"]["max"] == pytest.approx(2.0)
    assert (both["prompts_faster"], both["prompts"]) == (1, 2)
    # a record without prompt token counts (an older trace) has no prefill ratio, the rest stand
    bare = [(m, {k: v for k, v in a.items() if k != "prompt_tokens"}) for m, a in pairs]
    assert speedup_stats(bare)["prefill_speedup"] is None and speedup_stats(bare)["speedup"] == both["speedup"]


def test_the_table_puts_identity_counts_next_to_each_ratio_and_the_verdict_ignores_the_wall_ratio():
    recs = [rec("ar", 0, 100.0, 10, 20.0), rec("sd", 0, 60.0, 5, 10.0, identical=False),
            rec("ar", 1, 100.0, 10, 20.0), rec("sd", 1, 55.0, 5, 10.0, identical=False)]
    rows = group_rows(recs)
    sd = next(r for r in rows if r["method"] == "sd")
    assert sd["wall_speedup"] is None and sd["speedup"] < 1  # Σ wall would say 1.74×
    (v,) = verdicts(rows)
    assert not v["enable"] and v["identity"] == {"compared": 2, "identical": 0}
    assert identity_note(v) == "; greedy output identical to AR 0/2"
    header = list(MAIN_HEADER)
    row = dict(zip(header, next(t for t in table_rows(rows, max_new_tokens=[16]) if t[1] == "sd K=4")))
    assert row["Σ wall [same len]"] == "- [0/2]" and row["identical"] == "0/2"
    assert header.index("identical") == header.index("Σ wall [same len]") + 1  # right beside the ratios
    assert row["speedup"] == f"{sd['speedup']:.2f}×" and row["prefill/tok"] == "2.00×"
