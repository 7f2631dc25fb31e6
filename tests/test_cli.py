"""The `speclm` command line: `speclm.commands.main([...])` in process, plus one real
run of the installed console script. SmolLM2-135M only, a few tokens each,
one llama.cpp thread (robust on a busy machine)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from speclm.commands import main
from speclm.models import catalog, store
from speclm.models.registry import REGISTRY

SMOL = "smollm2-135m"
PROMPT = "def add(a, b):"
FAST = ["--target", SMOL, "--threads", "1"]


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """rich sizes tables from $COLUMNS when stdout is not a terminal; pin it."""
    monkeypatch.setenv("COLUMNS", "200")


def run(argv, capfd):
    """main(argv) -> (exit code, stdout, stderr), captured at the fd level so
    anything llama.cpp writes straight to fd 2 is seen too."""
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def assert_one_line_error(code, out, err, *needles):
    assert code == 1, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr must be exactly one line, got: {err!r}"
    assert lines[0].startswith("speclm: error: ")
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---- generate ------------------------------------------------------------------
def test_generate_json_compare_ar(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--method", "sd-ngram", "--max-new-tokens", "16",
                          "--json", "--compare-ar"], capfd)
    assert code == 0, err
    assert "Traceback" not in err
    lines = out.strip().splitlines()
    assert len(lines) == 1, "stdout must be ONE JSON object (no streamed text, no table)"
    data = json.loads(lines[0])
    assert {"text", "token_ids", "metrics", "ar", "speedup", "identical"} <= data.keys()
    assert data["method"] == "sd-ngram" and data["k"] == 4 and data["draft"] == "ngram[2..4]"
    assert isinstance(data["text"], str) and data["text"]
    assert 1 <= len(data["token_ids"]) <= 16 and all(isinstance(t, int) for t in data["token_ids"])
    m = data["metrics"]
    assert {"acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "rounds",
            "output_tokens", "tokens_per_s", "wall_ms"} <= m.keys()
    assert m["output_tokens"] == len(data["token_ids"])
    assert m["acceptance_rate"] is None or 0.0 <= m["acceptance_rate"] <= 1.0
    assert m["mean_acceptance_length"] >= 1.0
    assert {"text", "token_ids", "metrics"} <= data["ar"].keys()
    assert data["ar"]["metrics"]["acceptance_rate"] is None  # AR proposes nothing
    assert isinstance(data["speedup"], float) and data["speedup"] > 0
    assert isinstance(data["identical"], bool)
    assert data["identical"] == (data["ar"]["token_ids"] == data["token_ids"])
    assert data["identity"]["compared_tokens"] >= 1


def test_generate_text_and_stats_table(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--method", "sd-ngram", "--max-new-tokens", "8",
                          "--compare-ar"], capfd)
    assert code == 0, err
    assert "Traceback" not in err
    for row in ("method", "sd-ngram (K=4)", "acceptance rate", "mean acceptance length",
                "tok/s", "speedup vs AR", "greedy identity with AR"):
        assert row in out, row
    # the streamed text comes first, then the table
    assert out.index("acceptance rate") > 0 and not out.startswith("method")


def test_generate_json_text_matches_streamed_text(capfd):
    args = ["generate", PROMPT, *FAST, "--method", "ar", "--max-new-tokens", "6"]
    code, out_json, _ = run([*args, "--json"], capfd)
    assert code == 0
    text = json.loads(out_json)["text"]
    code, out_plain, _ = run(args, capfd)
    assert code == 0
    assert out_plain.startswith(text + "\n")  # streamed text, a newline, then the table


def test_generate_with_a_json_schema_file_emits_a_valid_object(capfd, tmp_path):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "maxItems": 2}},
              "required": ["name", "tags"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    code, out, err = run(["generate", "A user as JSON:", *FAST, "--method", "auto", "--max-new-tokens", "60",
                          "--json-schema", str(tmp_path / "s.json"), "--json", "--compare-ar"], capfd)
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(json.loads(data["text"]), schema)
    assert data["identical"] and data["forced_tokens"] > 0
    code, out, err = run(["generate", "x", *FAST, "--json-schema", str(tmp_path / "none.json")], capfd)
    assert_one_line_error(code, out, err, "cannot read the JSON schema file")
    code, out, err = run(["generate", "x", *FAST, "--regex", "a["], capfd)
    assert_one_line_error(code, out, err, "cannot be compiled")


def test_prompt_from_stdin(capfd, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    code, out, err = run(["generate", "-", *FAST, "--method", "ar", "--max-new-tokens", "3", "--json"], capfd)
    assert code == 0, err
    data = json.loads(out)
    assert data["prompt_tokens"] >= 3 and len(data["token_ids"]) == 3


def test_subprocess_console_script():
    """The installed entry point works end to end (one real process)."""
    script = shutil.which("speclm") or shutil.which("speclm", path=str(Path(sys.executable).parent))
    cmd = [script] if script else [sys.executable, "-m", "speclm"]
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run([*cmd, "generate", PROMPT, *FAST, "--method", "sd-ngram", "--max-new-tokens", "8",
                           "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["method"] == "sd-ngram" and 1 <= len(data["token_ids"]) <= 8


# ---- bad input: exit 1, one line on stderr, no traceback -------------------------
def test_empty_prompt(capfd):
    code, out, err = run(["generate", "", *FAST, "--method", "ar"], capfd)
    assert_one_line_error(code, out, err, "prompt is empty")
    assert out == ""


def test_empty_prompt_from_stdin(capfd, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    code, out, err = run(["generate", "-", *FAST, "--method", "ar"], capfd)
    assert_one_line_error(code, out, err, "prompt is empty")


@pytest.mark.parametrize("argv,needles", [
    (["--k", "0"], ["K must be an integer in [1, 32]", "got 0"]),
    (["--k", "-1", "--method", "sd-ngram"], ["K must be an integer", "sd-ngram", "got -1"]),
    (["--k", "1000"], ["K must be an integer in [1, 32]", "got 1000"]),
    (["--temperature", "-1"], ["temperature must be a finite number >= 0", "got -1.0"]),
    (["--temperature", "nan"], ["temperature must be a finite number"]),
    (["--top-p", "1.5"], ["top_p must be in (0, 1]", "got 1.5"]),
    (["--top-p", "0"], ["top_p must be in (0, 1]"]),
    (["--top-k", "-1"], ["top_k must be an integer >= 0"]),
    (["--min-p", "1"], ["min_p must be in [0, 1)"]),
    (["--max-new-tokens", "0"], ["max_new_tokens must be an integer >= 1"]),
    (["--seed", "-5"], ["seed must be a non-negative integer"]),
    (["--stop", ""], ["stop strings must be non-empty strings"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None)
def test_bad_parameters(capfd, argv, needles):
    code, out, err = run(["generate", PROMPT, *FAST, *argv], capfd)
    assert_one_line_error(code, out, err, *needles)
    assert out == ""


def test_unknown_target(capfd):
    code, out, err = run(["generate", PROMPT, "--target", "no-such-model", "--method", "ar"], capfd)
    line = assert_one_line_error(code, out, err, "unknown model 'no-such-model'")
    assert all(name in line for name in REGISTRY)


def test_unknown_draft(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--draft", "no-such-draft"], capfd)
    assert_one_line_error(code, out, err, "unknown model 'no-such-draft'")


def test_non_gguf_path(capfd, tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"definitely not a model\n" * 20)
    code, out, err = run(["generate", PROMPT, "--target", str(path), "--method", "ar"], capfd)
    assert_one_line_error(code, out, err, f"{path} is not a GGUF file", "pass a .gguf model file")


def test_missing_gguf_path(capfd, tmp_path):
    path = tmp_path / "nope.gguf"
    code, out, err = run(["generate", PROMPT, "--target", str(path), "--method", "ar"], capfd)
    assert_one_line_error(code, out, err, f"model file {path} does not exist")


def test_sd_draft_without_draft(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--method", "sd-draft"], capfd)
    assert_one_line_error(code, out, err, "sd-draft needs a draft model", "--draft")


def test_prompt_longer_than_context(capfd):
    code, out, err = run(["generate", "hello world " * 20, *FAST, "--method", "ar", "--n-ctx", "32"], capfd)
    assert_one_line_error(code, out, err, "context holds 32", "--n-ctx")


def test_bad_n_ctx(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--method", "ar", "--n-ctx", "8"], capfd)
    assert_one_line_error(code, out, err, "n_ctx must be an integer >= 16")


def test_bad_ngram_sizes(capfd):
    code, out, err = run(["generate", PROMPT, *FAST, "--method", "sd-ngram", "--ngram-min", "5",
                          "--ngram-max", "2"], capfd)
    assert_one_line_error(code, out, err, "n-gram sizes must satisfy", "got 5..2")


def test_truncated_gguf_path_is_one_line(capfd, tmp_path):
    src = catalog.resolve_model(SMOL)
    path = tmp_path / "half.gguf"
    with open(src, "rb") as fin, open(path, "wb") as fout:
        fout.write(fin.read(src.stat().st_size // 2))
    code, out, err = run(["generate", PROMPT, "--target", str(path), "--method", "ar"], capfd)
    assert_one_line_error(code, out, err, f"could not load {path}")


def test_absurd_thread_count(capfd, monkeypatch):
    from speclm.backends import llamacpp

    def refuse(model, cparams):  # never let llama.cpp really try 100000 threads
        raise AssertionError(f"a llama.cpp context was created with n_threads={cparams.n_threads}")
    monkeypatch.setattr(llamacpp.L, "llama_init_from_model", refuse)
    code, out, err = run(["generate", PROMPT, "--target", SMOL, "--method", "ar", "--threads", "100000"], capfd)
    assert_one_line_error(code, out, err, "--threads")


@pytest.mark.parametrize("argv,needle", [
    (["generate", PROMPT, "--method", "eagle"], "invalid choice: 'eagle'"),
    (["generate", PROMPT, "--k", "four"], "invalid int value: 'four'"),
    (["generate"], "the following arguments are required: PROMPT"),
    (["models"], "the following arguments are required"),
])
def test_usage_errors_exit_2(capfd, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capfd.readouterr()
    assert needle in err and "Traceback" not in err


# ---- models --------------------------------------------------------------------
def test_models_list_shows_the_three_names(capfd):
    code, out, err = run(["models", "list"], capfd)
    assert code == 0, err
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", SMOL):
        assert name in out, name
    assert "ready" in out and "NAME" in out


def test_models_list_names_survive_80_columns(capfd, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(["models", "list"], capfd)
    assert code == 0, err
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", SMOL):
        assert name in out, name
    assert str(catalog.resolve_model(SMOL)) in out.replace("\n", "")


def test_models_path_prints_an_existing_gguf(capfd):
    code, out, err = run(["models", "path", SMOL], capfd)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    path = Path(lines[0])
    assert path.is_file() and path.suffix == ".gguf"
    assert path.stat().st_size == REGISTRY[SMOL].size
    with open(path, "rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_models_path_unknown_name(capfd):
    code, out, err = run(["models", "path", "no-such-model"], capfd)
    assert_one_line_error(code, out, err, "unknown model 'no-such-model'")
