"""`speclm bench --targets/--drafts`: one run over target and draft variants.

SmolLM2-135M and its q8_0 variant (prepared once into a private cache dir,
never the real cache) serve as both targets and drafts: two targets × two
drafts, one prompt, 8 tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from speclm.commands import bench as bench_cli
from speclm.bench.run import models as bench_models
from speclm.bench.setup import texts as bench_texts
from speclm.bench.output.results import table_rows
from speclm.errors import InvalidRequestError, ModelError
from speclm.models import variants

SMOL = "smollm2-135m"
Q8 = f"{SMOL}@q8_0"
FAST = ["--threads", "1", "--methods", "ar,sd-draft", "--k", "1,2", "--categories", "humaneval",
        "--prompts-per-category", "1", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("sweep-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLM_CACHE_DIR", str(cache))
        variants.prepare_variant(SMOL, "q8_0", n_threads=1)
    return cache


@pytest.fixture
def cache(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECLM_CACHE_DIR", str(prepared))
    monkeypatch.setattr(bench_texts, "QUALITY_TEXTS", 1)  # ppl_text + one HumanEval problem: enough here
    return prepared


def bench(*argv: str) -> int:
    p = argparse.ArgumentParser(prog="speclm")
    bench_cli.add_bench_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["bench", "--no-wait-quiet", *argv])  # a test must not wait for the machine to calm
    return args.func(args)


@pytest.fixture(scope="module")
def swept(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sweep run through the CLI: 2 targets × 2 drafts × K in {1, 2}, with quality."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLM_CACHE_DIR", str(prepared))
        mp.setenv("COLUMNS", "200")
        mp.setattr(bench_texts, "QUALITY_TEXTS", 1)
        assert bench("--targets", f"{SMOL},{Q8}", "--drafts", f"{SMOL},{Q8}", "--variant-quality",
                     *FAST, "--out", str(out)) == 0
    return out


def test_sweep_writes_the_variants_section_with_every_field(swept: Path) -> None:
    summary = json.loads((swept / "summary.json").read_text())
    v = summary["variants"]
    assert v["reference"] == SMOL and v["ks"] == [1, 4, 8, 16] and v["quality"]
    assert [t["name"] for t in v["targets"]] == [SMOL, Q8] and [d["name"] for d in v["drafts"]] == [SMOL, Q8]
    for m in v["targets"] + v["drafts"]:
        assert Path(m["file"]).stat().st_size == m["size"] and len(m["sha256"]) == 64
        assert 1.0 < m["perplexity"] < 100 and m["ppl_tokens"] > 500 and 0.5 < m["agreement"] <= 1.0
        assert set(m["v_ms"]) == {"1", "4", "8", "16"} and all(x > 0 for x in m["v_ms"].values())
    assert v["targets"][0]["agreement"] == 1.0 and v["targets"][1]["source"] == "variant"
    assert v["targets"][1]["quant"] == "q8_0"
    rows = v["rows"]
    assert [(r["target"], r["draft"]) for r in rows] == [(t, d) for t in (SMOL, Q8) for d in (SMOL, Q8)]
    fields = ("target_file", "target_size", "draft_file", "draft_size", "target_perplexity", "draft_perplexity",
              "agreement", "ar_tok_s", "sd_tok_s", "accepted_progress_per_ms", "speedup")
    for r in rows:
        assert all(r[f] is not None for f in fields), r
        assert r["best"]["method"] == "sd-draft" and r["best"]["k"] in (1, 2)
        assert r["accepted_progress_per_ms"] == pytest.approx(r["sd_tok_s"] / 1000)
        assert sorted(c["k"] for c in r["by_config"]) == [1, 2] and set(r["v_ms"]) == {"1", "4", "8", "16"}
    best = v["best"]
    assert best["accepted_progress_per_ms"] == max(r["accepted_progress_per_ms"] for r in rows)
    assert best["reference_perplexity"] == v["targets"][0]["perplexity"] and best["perplexity_cost"] is not None
    assert v["best_sentence"].startswith(f"Best pair by accepted progress per ms: {best['target']}")
    report = (swept / "report.md").read_text()
    assert "## Variants" in report and v["best_sentence"] in report and "v(1)/v(4)/v(8)/v(16) ms" in report
    table = [line for line in report.splitlines() if line.startswith("| `smollm2-135m")]
    assert len(table) == 4  # one row per target × draft
    assert "`smollm2-135m@q8_0` (138 MiB)" in table[-1] and "(sd-draft K=" in table[-1]
    assert f"- **humaneval** on `{Q8}`" in report


def test_records_and_manifest_name_the_exact_files(swept: Path, cache: Path) -> None:
    requests = [json.loads(x) for x in (swept / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == 2 * (1 + 2 * 2)  # per target: AR + sd-draft × K{1,2} × 2 drafts
    assert len({r["request_id"] for r in requests}) == len(requests)
    manifest = json.loads((swept / "manifest.json").read_text())
    by_name = {m["name"]: m for m in manifest["models"]["targets"] + manifest["models"]["drafts"]}
    assert set(by_name) == {SMOL, Q8} and manifest["models"]["target"]["name"] == SMOL
    assert by_name[Q8]["sha256"] == variants.read_manifest()[Q8]["sha256"]  # the recorded sha256 of the variant
    for r in requests:
        target = by_name[r["target_name"]]
        assert r["target"] == target["path"] and r["target_sha256"] == target["sha256"]
        if r["method"] == "sd-draft":
            assert r["draft"] == "draft:" + by_name[r["draft_name"]]["path"]
            assert r["draft_sha256"] == by_name[r["draft_name"]]["sha256"]


def test_rows_never_pool_targets_or_drafts(swept: Path) -> None:
    summary = json.loads((swept / "summary.json").read_text())
    rows = summary["rows"]
    ar = [r for r in rows if r["method"] == "ar"]
    assert sorted(r["target_name"] for r in ar) == sorted([SMOL, Q8]) and all(r["requests"] == 1 for r in ar)
    sd = [r for r in rows if r["method"] == "sd-draft"]
    assert len(sd) == 2 * 2 * 2 and all(r["requests"] == 1 and r["prompts"] == 1 for r in sd)
    assert len({(r["target"], r["draft"], r["k"]) for r in sd}) == 8
    assert {v["target_name"] for v in summary["verdicts"]} <= {SMOL, Q8} and len(summary["verdicts"]) == 2
    table = table_rows(summary["rows"], summary["config"]["max_new_tokens"])
    assert len({row[1] for row in table}) == len(table)  # every label names its target (+ draft)
    assert any(f"[{Q8} + {SMOL}]" in row[1] for row in table)


def test_target_and_targets_together_are_rejected(cache: Path) -> None:
    with pytest.raises(InvalidRequestError, match="--target NAME or --targets"):
        bench("--target", SMOL, "--targets", f"{SMOL},{Q8}", *FAST)
    with pytest.raises(InvalidRequestError, match="--draft NAME or --drafts"):
        bench("--targets", SMOL, "--draft", SMOL, "--drafts", Q8, *FAST)
    with pytest.raises(InvalidRequestError, match="no method in --methods uses a draft"):
        bench("--targets", SMOL, "--drafts", SMOL, *FAST[:2], "--methods", "ar,sd-ngram")


def test_unknown_variant_is_a_clear_error_before_any_model_loads(cache: Path, monkeypatch) -> None:
    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the names were checked")
    monkeypatch.setattr(bench_models, "load_backend", no_load)
    with pytest.raises(ModelError, match=r"speclm models prepare smollm2-135m --quant q5_0"):
        bench("--targets", f"{SMOL},{SMOL}@q5_0", "--drafts", SMOL, *FAST)
    with pytest.raises(ModelError, match="q3_x"):
        bench("--targets", SMOL, "--drafts", f"{SMOL}@q3_x", *FAST)
    with pytest.raises(ModelError, match="no-such-model"):
        bench("--targets", f"{SMOL},no-such-model", "--drafts", SMOL, *FAST)
