"""Kernel configurations are proven in child processes before use: a crash, a
hang or wrong logits disables one; verdicts are cached per machine, build and
model; `--kernels` is one validated setting on every surface."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from speclm.backends import kernels as K
from speclm.backends import probe
from speclm.errors import InvalidRequestError

SMOL = "smollm2-135m"


@pytest.fixture(scope="module")
def smol_path() -> Path:
    from speclm.models.catalog import resolve_model
    return resolve_model(SMOL)


@pytest.fixture
def verdicts(tmp_path, monkeypatch) -> Path:
    """A private verdict file: every test here probes afresh."""
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("SPECLM_KERNELS_CACHE", str(path))
    monkeypatch.delenv(probe.FAULT_ENV, raising=False)
    monkeypatch.delenv(K.KERNELS_ENV, raising=False)
    return path


def choose(path: Path, request: str | None = None, said: list | None = None) -> probe.KernelChoice:
    """A choice that neither sets nor is bound by this test process's switches."""
    return probe.choose_kernels(path, request, threads=2, say=(said if said is not None else []).append,
                                apply=False)


def test_a_crashing_configuration_is_disabled_and_generation_goes_on_with_the_next(verdicts, tmp_path):
    # every family faster than plain crashes (amx too, where the build has it), so plain is what is left
    env = {**os.environ, probe.FAULT_ENV: "repack:segv,speclm:segv,speclm-repack:segv,amx:segv"}
    proc = subprocess.run([sys.executable, "-m", "speclm", "generate", "def add(a, b):", "--target", SMOL,
                           "--max-new-tokens", "8", "--method", "ar", "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kernels"]["kernels"].startswith("plain")
    assert out["kernels"]["verdicts"]["repack"] == "crashed (killed by SIGSEGV)"
    assert out["kernels"]["verdicts"]["repack+tiled"] == "crashed (killed by SIGSEGV)"
    assert out["token_ids"], "it generated on the configuration that passed"
    notice = [ln for ln in proc.stderr.splitlines() if "disabled" in ln]
    assert len(notice) == 1 and "repack+tiled: crashed (killed by SIGSEGV)" in notice[0] \
        and "repack: crashed (killed by SIGSEGV)" in notice[0]


def test_a_hanging_configuration_is_cut_off_at_the_timeout(verdicts, smol_path, monkeypatch):
    monkeypatch.setenv(probe.FAULT_ENV, "repack+tiled:hang")
    monkeypatch.setenv("SPECLM_PROBE_TIMEOUT", "20")  # room for a loaded machine: the plain probe must finish
    said: list[str] = []
    choice = choose(smol_path, "repack", said)
    assert choice.verdicts["repack+tiled"].status == "hung"
    assert choice.verdicts["repack+tiled"].detail == "no answer within 20 s"
    assert choice.name == "repack"
    assert "repack+tiled: hung (no answer within 20 s)" in said[-1]


def test_a_probe_on_a_busy_machine_says_its_cached_timings_may_be_off(verdicts, smol_path, monkeypatch):
    """The verdicts' timings choose the kernels and stay cached, so a probe that starts
    while other processes keep more than half the cores busy says so and names the
    re-probe; a quiet one does not (what "busy" means: tests/test_busy_now.py)."""
    cores = os.cpu_count() or 1
    for load, busy in ((cores * 0.9, True), (0.0, False)):
        monkeypatch.setattr(probe, "busy_cpus", lambda load=load: load)
        said: list[str] = []
        choose(smol_path, "plain", said)
        assert any("MACHINE BUSY" in s and "speclm doctor --reprobe" in s for s in said) == busy, said
        probe.forget(smol_path)


def test_wrong_logits_disable_a_configuration(verdicts, smol_path, monkeypatch):
    monkeypatch.setenv(probe.FAULT_ENV, "plain+tiled:wrong")
    choice = choose(smol_path, "plain")
    bad = choice.verdicts["plain+tiled"]
    assert bad.status == "wrong" and "differ" in bad.detail and "plain kernels" in bad.detail
    assert choice.name == "plain" and choice.verdicts["plain"].usable


def test_verdicts_are_cached_and_a_changed_machine_key_probes_again(verdicts, smol_path, monkeypatch):
    calls: list[str] = []
    real = probe._run_child
    monkeypatch.setattr(probe, "_run_child", lambda config, *a, **kw: calls.append(config.name) or real(config, *a, **kw))
    first = choose(smol_path, "plain")
    assert sorted(calls) == ["plain", "plain+tiled"]  # the reference (plain) is one of them
    assert all(v.usable and v.v_ms for v in first.verdicts.values())
    calls.clear()
    again = choose(smol_path, "plain")
    assert calls == [] and again.name == first.name and again.v_ms == first.v_ms
    monkeypatch.setattr(probe, "machine_key", lambda: "another-cpu-or-build")
    choose(smol_path, "plain")
    assert sorted(calls) == ["plain", "plain+tiled"]
    assert len(json.loads(verdicts.read_text())) == 2  # one entry per machine key


def test_a_curve_timed_at_one_thread_count_is_not_taken_for_another(verdicts, smol_path, monkeypatch):
    calls: list[tuple[str, int]] = []
    real = probe._run_child
    monkeypatch.setattr(probe, "_run_child",
                        lambda config, path, out, threads, timed: calls.append((config.name, threads))
                        or real(config, path, out, threads, timed))
    two = choose(smol_path, "plain")
    one = probe.choose_kernels(smol_path, "plain", threads=1, say=[].append, apply=False)
    assert sorted(calls) == [("plain", 1), ("plain", 2), ("plain+tiled", 1), ("plain+tiled", 2)]
    assert {v.threads for v in two.verdicts.values()} == {2} and {v.threads for v in one.verdicts.values()} == {1}
    assert two.curve(2) == two.v_ms and two.curve(1) is None and one.curve(1) == one.v_ms
    calls.clear()
    choose(smol_path, "plain")
    probe.choose_kernels(smol_path, "plain", threads=1, say=[].append, apply=False)
    assert calls == [], "each thread count keeps its own verdicts"
    probe.forget(smol_path)
    choose(smol_path, "plain")
    assert sorted(calls) == [("plain", 2), ("plain+tiled", 2)], "forgetting a model forgets every thread count"


def test_the_first_speculating_request_starts_from_the_probes_curve(smollm, monkeypatch):
    """No second timing of v(b) where the probe timed it for this file, machine and threads;
    the draft-free proposals share it, and a model without such a curve is timed as before."""
    from speclm import LLM, costs
    target = smollm.target
    curve = target.kernel_choice.curve(target.n_threads)
    assert curve and set(curve) == set(probe.TIMED_BLOCKS)

    def no_timing(*args, **kwargs):
        raise AssertionError("v(b) timed again")
    monkeypatch.setattr(costs, "time_curve", no_timing)
    llm = LLM(target=target)
    for proposal in ("suffix", None):
        assert llm.measure_costs(proposal, 16).verify_ms == curve
    monkeypatch.setattr(target, "kernel_choice", None)  # as a backend the probe never timed
    with pytest.raises(AssertionError, match="timed again"):
        LLM(target=target).measure_costs("suffix", 16)


def test_costs_read_from_the_probes_curve_need_no_free_sequence(smollm):
    """Nothing is timed, so a first speculating request is not busy while requests hold
    every KV sequence (a model that must be timed is: tests/test_server_busy.py)."""
    from speclm import LLM
    target = smollm.target
    held = [target.new_sequence() for _ in range(target.max_sequences - target.live_sequences)]
    try:
        cost = LLM(target=target).measure_costs("suffix", 16)
    finally:
        for seq in held:
            target.free(seq)
    assert cost.verify_ms == target.kernel_choice.curve(target.n_threads)


def test_a_configuration_checked_only_as_the_small_models_screen_is_timed_when_that_model_loads(verdicts,
                                                                                                smol_path):
    probe._record(smol_path, 2, {"repack": probe.Verdict("repack", "ok")})  # what a larger model's screen leaves
    choice = choose(smol_path, "repack")
    assert choice.verdicts["repack"].v_ms and set(choice.verdicts["repack"].v_ms) == set(probe.TIMED_BLOCKS)


def test_forcing_a_configuration_the_probe_found_broken_names_the_verdict_and_the_fix(verdicts, smol_path,
                                                                                       monkeypatch):
    monkeypatch.setenv(probe.FAULT_ENV, "repack:segv,speclm:segv,speclm-repack:segv,amx:segv")  # amx too: on an AMX build it would win
    choose(smol_path)
    monkeypatch.delenv(probe.FAULT_ENV)
    with pytest.raises(InvalidRequestError) as err:
        choose(smol_path, "repack")
    assert "crashed (killed by SIGSEGV)" in str(err.value) and "speclm doctor --reprobe" in str(err.value)
    assert choose(smol_path, "auto").config.buffers == "plain"  # the cached verdict holds until a re-probe
    probe.forget()
    assert choose(smol_path, "repack").config.buffers == "repack"


@pytest.mark.skipif(K.build_info().amx, reason="this llama.cpp build has AMX")
def test_amx_on_a_build_without_it_is_a_clear_error(verdicts, smol_path):
    with pytest.raises(InvalidRequestError, match=r"kernels amx: this llama.cpp build has no AMX kernels"):
        choose(smol_path, "amx")


@pytest.mark.parametrize("bad", ["fast", "repack+untiled", "amx+", "auto+tiled"])
def test_an_unknown_kernels_name_is_refused(bad, monkeypatch):
    with pytest.raises(InvalidRequestError, match="unknown kernels"):
        K.check_request(bad)
    monkeypatch.setenv(K.KERNELS_ENV, bad)
    with pytest.raises(InvalidRequestError, match="unknown kernels"):
        K.check_request(None)


def test_the_environment_variable_sets_the_default_and_an_argument_wins(monkeypatch):
    monkeypatch.setenv(K.KERNELS_ENV, "Plain")
    assert K.check_request(None) == "plain"
    assert K.check_request("repack+tiled") == "repack+tiled"
    monkeypatch.delenv(K.KERNELS_ENV)
    assert K.check_request(None) == "auto"


@pytest.mark.parametrize("command", [["generate", "x"], ["serve"], ["bench"], ["doctor"]])
def test_every_command_takes_kernels(command, capsys):
    from speclm.commands import build_parser
    parser = build_parser()
    assert parser.parse_args([*command, "--kernels", "REPACK"]).kernels == "repack"
    assert parser.parse_args(command).kernels is None
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([*command, "--kernels", "turbo"])
    assert exit_.value.code == 2 and "unknown kernels 'turbo'" in capsys.readouterr().err


def test_the_api_refuses_an_unknown_kernels_name():
    from speclm import LLM
    from speclm.backends.toy import ToyBackend
    with pytest.raises(InvalidRequestError, match="unknown kernels 'gpu'"):
        LLM(target=ToyBackend(vocab_size=8), kernels="gpu")
    with pytest.raises(InvalidRequestError, match="kernels_for must be"):
        LLM(target=ToyBackend(vocab_size=8), kernels_for="training")


def test_logits_agree_within_the_tolerance_and_not_beyond():
    rng = np.random.default_rng(0)
    ref = {"2": rng.normal(size=(2, 50)).astype(np.float32) * 3}
    ref["2"][:, 7] += 20  # token 7 leads clearly
    assert probe.compare_logits(ref, {"2": ref["2"] + 0.4}) is None  # what sound paths differ by
    assert "differ by 2.00" in probe.compare_logits(ref, {"2": ref["2"] + 2.0})
    flipped = ref["2"].copy()
    flipped[:, [7, 8]] = flipped[:, [8, 7]]
    assert probe.compare_logits(ref, {"2": flipped}) is not None
    nan = ref["2"].copy()
    nan[0, 0] = np.nan
    assert "non-finite" in probe.compare_logits(ref, {"2": nan})
    assert "no logits" in probe.compare_logits(ref, {})


def test_decoding_is_scored_by_one_step_and_speculation_by_the_whole_curve():
    cheap_blocks = {1: 100.0, 2: 120.0, 4: 150.0, 8: 200.0, 16: 300.0}
    dear_blocks = {1: 90.0, 2: 180.0, 4: 360.0, 8: 720.0, 16: 1440.0}
    assert probe.work_rate(dear_blocks, "decoding") > probe.work_rate(cheap_blocks, "decoding")
    assert probe.work_rate(cheap_blocks, "speculation") > 2 * probe.work_rate(dear_blocks, "speculation")
    assert probe.work_rate(dear_blocks, "speculation") >= probe.work_rate(dear_blocks, "decoding") * (1 - 1e-12)  # K = 0


def test_each_score_counts_a_prompt_token_per_generated_one():
    # a generated token's time gains PROMPT_PER_TOKEN prompt tokens' share of the timed prefill,
    # so a configuration with cheaper blocks but a dearer prefill can lose (docs/kernels.md#the-choice)
    blocks = {1: 40.0, 2: 60.0, 4: 80.0, 8: 120.0, 16: 200.0}
    alone = probe.work_rate(blocks, "decoding")
    with_prompt = probe.work_rate(blocks, "decoding", prefill_ms=2560.0)
    assert with_prompt == pytest.approx(1000 / (1000 / alone + probe.PROMPT_PER_TOKEN * 2560.0 / probe.PREFILL_TOKENS))
    quick_prompt = {b: ms * 1.05 for b, ms in blocks.items()}
    for work in ("decoding", "speculation"):
        assert probe.work_rate(blocks, work) > probe.work_rate(quick_prompt, work)
        assert probe.work_rate(blocks, work, prefill_ms=2700.0) < probe.work_rate(quick_prompt, work, prefill_ms=1900.0)
    assert probe.work_rate(blocks, "speculation", prefill_ms=None) == probe.work_rate(blocks, "speculation")


def test_a_configuration_must_beat_an_earlier_one_by_the_tie_margin(smol_path):
    build = K.BuildInfo("test", amx=False, repack=True)
    curve = {1: 100.0, 2: 150.0, 4: 250.0, 8: 450.0, 16: 850.0}
    faster = {b: ms / (1 + probe.TIE / 2) for b, ms in curve.items()}
    wanted = {"repack+tiled": probe.Verdict("repack+tiled", "ok", v_ms=curve),
              "repack": probe.Verdict("repack", "ok", v_ms=faster)}
    assert probe._pick(smol_path, "auto", "speculation", build, wanted, wanted, False).name == "repack+tiled"
    wanted["repack"].v_ms = {b: ms / (1 + 2 * probe.TIE) for b, ms in curve.items()}
    assert probe._pick(smol_path, "auto", "speculation", build, wanted, wanted, False).name == "repack"


def test_a_process_keeps_the_switches_its_first_model_fixed():
    build = K.BuildInfo("test", amx=True, repack=True)
    state = K.ProcessKernels(tiled=False, amx_masked=True, fixed_by="target.gguf")
    assert "tiled matmul off" in state.fits(K.parse_config("repack+tiled"), build)
    assert "AMX is masked" in state.fits(K.parse_config("amx"), build)
    assert state.fits(K.parse_config("repack"), build) is None
    amx = K.ProcessKernels(tiled=True, amx_masked=False, fixed_by="target.gguf")
    assert "already uses AMX" in amx.fits(K.parse_config("repack+tiled"), build)


@pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64", reason="x86-64 Linux only")
def test_the_amx_mask_refuses_the_amx_permission_request_and_nothing_else():
    code = ("import ctypes; from speclm.backends.kernels import mask_amx\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "mask_amx()\n"
            "req = libc.syscall(158, 0x1023, 18), ctypes.get_errno()\n"
            "fs = ctypes.c_ulong(); get = libc.syscall(158, 0x1003, ctypes.byref(fs))\n"
            "print(req[0], req[1], get, fs.value != 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["-1", "1", "0", "True"], out.stderr  # EPERM; ARCH_GET_FS still works


def test_doctor_reports_verdicts_costs_and_the_choice(verdicts):
    proc = subprocess.run([sys.executable, "-m", "speclm", "doctor", "--target", SMOL, "--json", "--no-quality"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["cpu"] and d["system_info"].startswith("CPU") and d["verdict_file"] == str(verdicts)
    model = d["models"][0]
    assert model["name"] == SMOL and model["uses"] in model["configs"]
    for name, row in model["configs"].items():
        assert row["verdict"] == "ok" and set(row["v_ms"]) == {str(b) for b in probe.TIMED_BLOCKS}, name
        assert row["prefill_ms"] > row["v_ms"]["64"], name  # a 256-token prompt: more than one 64-row forward
    text = subprocess.run([sys.executable, "-m", "speclm", "doctor", "--target", SMOL, "--no-quality"],
                          capture_output=True, text=True, timeout=600).stdout
    assert f"speclm uses: {model['uses']}" in text and "v(16)" in text and f"pre({probe.PREFILL_TOKENS})" in text


# constructed curves after the Zen 3's of issue 41 (tiled: v(1) 67 ms, 8 and 16 rows 452 and 568 ms;
# repack: 70, 331, 531 ms), made so that small blocks favour tiled and 16 rows clearly favour repack
TILED = {1: 67.0, 2: 90.0, 4: 260.0, 8: 452.0, 16: 600.0}
REPACK = {1: 70.0, 2: 120.0, 4: 200.0, 8: 331.0, 16: 400.0}


def test_a_server_is_given_the_kernels_of_its_full_load_and_one_stream_those_of_speculation(smol_path):
    build = K.BuildInfo("test", amx=False, repack=True)
    wanted = {"repack+tiled": probe.Verdict("repack+tiled", "ok", v_ms=TILED),
              "repack": probe.Verdict("repack", "ok", v_ms=REPACK)}
    one = probe._pick(smol_path, "auto", "speculation", build, wanted, wanted, False)
    served = probe._pick(smol_path, "auto", "serving", build, wanted, wanted, False, streams=16)
    assert one.name == "repack+tiled" and one.reason.startswith("auto: fastest for speculation")
    assert served.name == "repack" and served.reason.startswith("auto: fastest for serving 16 streams")
    # 16 one-token blocks: one forward each (400 against 600 ms; no split the engine would run is cheaper)
    assert probe.work_rate(REPACK, "serving", 16) == pytest.approx(16_000 / 400)
    assert probe.work_rate(TILED, "serving", 16) == pytest.approx(16_000 / 600)
    assert probe.work_rate(TILED, "serving", 1) == probe.work_rate(TILED, "speculation")  # one stream speculates


@pytest.mark.parametrize("concurrency,work", [("16", "serving"), ("1", "speculation")])
def test_speclm_serve_chooses_kernels_for_the_requests_it_serves_together(concurrency, work):
    from speclm.commands import build_parser
    from speclm.commands.serve import server_settings
    args = build_parser().parse_args(["serve", "--max-concurrency", concurrency])
    _, config, arguments = server_settings(args)
    assert arguments["kernels_for"] == work and arguments["max_sequences"] == config.max_concurrency
