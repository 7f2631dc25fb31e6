"""Every setting is declared once, on its dataclass field (speclm/options.py):
the commands' flags and the server's request fields are generated from those
declarations, every surface has the same default, and a setting the request's
method would ignore is an error, not a silent no-op."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.backends.load import LoadConfig
from speclm.backends.toy import ToyBackend
from speclm.distributed.settings import RaySettings
from speclm.bench.setup.config import BenchConfig
from speclm.bench.setup.workloads import WorkloadConfig
from speclm.bench.trust.policy import TrustPolicy
from speclm.commands import build_parser
from speclm.engine import Engine
from speclm.errors import InvalidRequestError
from speclm.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET, default_draft
from speclm.options import option, options_of
from speclm.server import schemas
from speclm.server.config import ListenConfig, ServerConfig
from speclm.speculative import config
from speclm.speculative.config import spec_options
from speclm.speculative.ssd.client import SpeculatorConfig

COMMANDS = ("generate", "serve", "bench")
COMMAND_ARGS = {  # arguments of one command alone: what it does, not a setting
    "generate": {"--chat", "--compare-ar", "--json", "--prediction", "--json-schema", "--json-object", "--regex",
                 "--lark"},
    "serve": {"--ray"},
    "bench": {"--targets", "--drafts", "--variant-quality", "--out", "--quick", "--no-wait-quiet", "--endpoint",
              "--endpoint-b", "--endpoint-api-key", "--endpoint-api-key-b", "--endpoint-operator-key",
              "--endpoint-model", "--endpoint-model-b", "--endpoint-timeout"},
}
OUTPUT_ARGS = {"--json"}  # how a command prints, the same switch wherever it is


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{flag: help} of every optional argument."""
    return {s: a.help for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def declared() -> dict[str, str]:
    """{flag: help} of every declared setting."""
    out = {}
    for cls in (LoadConfig, SamplingParams, SpeculatorConfig, ServerConfig, ListenConfig, BenchConfig,
                WorkloadConfig, TrustPolicy, RaySettings):
        out.update({o.flag: o.help for o in options_of(cls)})
    out.update({o.flag: o.help for o in spec_options()})
    return out


@dataclasses.dataclass(frozen=True)
class Knobs:
    """A new method's own settings, declared in one place."""

    knob: int = option(3, "how far to turn the knob", request=True)


def test_a_setting_declared_once_appears_in_every_command_and_the_server(monkeypatch):
    monkeypatch.setitem(config.SECTIONS, "knobs", Knobs)
    parsers = subparsers()
    for name in COMMANDS:
        helps = flags(parsers[name])
        assert helps["--knob"].startswith("how far to turn the knob (default 3)"), name
    assert "knob" in schemas._speculative_options().model_fields  # the server's `speculative` request field
    args = parsers["generate"].parse_args(["x", "--knob", "5"])
    assert getattr(args, "knobs.knob") == 5


def test_no_command_declares_a_shared_setting_by_hand():
    """A flag that two commands share is a declared setting, with one help line everywhere (a
    bench sweep of a setting adds to that setting's help); only a command's own arguments are
    written in the command."""
    parsers, known = subparsers(), declared()
    seen: dict[str, dict[str, str]] = {}
    for name, parser in parsers.items():
        for flag, help_ in flags(parser).items():
            seen.setdefault(flag, {})[name] = help_
    for flag, by_command in seen.items():
        if len(by_command) > 1:
            assert flag in known or flag in OUTPUT_ARGS, f"{flag} is written by hand in {sorted(by_command)}"
            helps = [h.split(" (default")[0] for h in by_command.values()]
            declared_help = min(helps, key=len)  # a sweep adds to its setting's help, never rewrites it
            assert all(h.startswith(declared_help) for h in helps), (flag, helps)
    for name in ("generate", "serve", "bench"):
        hand_written = set(flags(parsers[name])) - set(known)
        assert hand_written <= COMMAND_ARGS[name], (name, hand_written - COMMAND_ARGS[name])


# settings whose request shape is OpenAI's, not the library's: logit_bias's keys are strings;
# logprobs is a bool plus top_logprobs on chat, a count on completions, and with echo sets prompt_logprobs
BY_ENDPOINT = {"logit_bias": "logit_bias", "logprobs": "logprobs", "prompt_logprobs": "echo",
               "grammar": "response_format"}


def test_the_servers_sampling_fields_are_the_declared_ones():
    fields = schemas.CompletionRequest.model_fields
    for o in options_of(SamplingParams):
        assert (o.request or BY_ENDPOINT[o.name]) in fields, o.name
    assert "max_tokens" in fields and "max_new_tokens" not in fields  # OpenAI's name for it


def test_a_request_leaving_out_temperature_gets_openais_default_and_the_rest_the_librarys():
    req = schemas.CompletionRequest(prompt="x")
    params = req.sampling(max_tokens=5)
    library = SamplingParams()
    assert params.temperature == 1.0
    assert (params.top_k, params.top_p, params.min_p, params.stop) == \
        (library.top_k, library.top_p, library.min_p, library.stop)


def test_every_surface_defaults_to_the_same_method():
    toy = LLM(target=ToyBackend(6, seed=1), suffix_cache_tokens=0)
    alone = toy.generate([0, 1, 2], SamplingParams(max_new_tokens=3))
    engine = Engine(toy, max_concurrency=1)
    try:
        queued = engine.submit([0, 1, 2], SamplingParams(max_new_tokens=3)).result(timeout=30)
    finally:
        engine.shutdown()
    assert alone.method == queued.method == SpecConfig().method == ServerConfig().spec.method


@pytest.mark.parametrize("spec, unused", [
    (SpecConfig(method="auto", p_min=0.3), "p_min"),
    (SpecConfig(method="sd-suffix", ngram_max=6), "ngram_max"),
    (SpecConfig(method="sd-ngram").with_options(max_depth=8), "suffix_max_depth"),
    (SpecConfig(method="sd-ngram", proposal="suffix"), "proposal (--proposer)"),
    (SpecConfig(method="ar").with_options(fanout=2), "ssd_fanout (--fanout)"),
])
def test_a_setting_the_method_does_not_read_is_an_error(spec, unused):
    toy = LLM(target=ToyBackend(6, seed=1))
    with pytest.raises(InvalidRequestError) as err:
        toy.generate([0, 1, 2], SamplingParams(max_new_tokens=3), spec)
    assert str(err.value).startswith(f"{unused} is not read by method {spec.method}")


def test_a_setting_the_method_reads_is_fine():
    toy = LLM(target=ToyBackend(6, seed=1), draft=ToyBackend(6, seed=2))
    out = toy.generate([0, 1, 2], SamplingParams(max_new_tokens=3), SpecConfig(method="sd-draft", p_min=0.3))
    assert len(out.token_ids) == 3


def test_the_default_draft_belongs_to_the_default_target_and_its_variants():
    assert default_draft(None) == default_draft(DEFAULT_TARGET) == DEFAULT_DRAFT
    assert default_draft(f"{DEFAULT_TARGET}@iq4_nl-pure") == DEFAULT_DRAFT
    assert default_draft("smollm2-135m") is None and default_draft("/models/other.gguf") is None


def test_a_request_setting_its_method_ignores_is_a_400_but_the_servers_defaults_are_not_its_mistake():
    asks = schemas.CompletionRequest(prompt="x", speculative={"method": "auto", "ngram_max": 6})
    with pytest.raises(schemas.ParamError) as err:
        asks.spec(SpecConfig(), has_draft=False)
    assert err.value.param == "speculative" and "speculative.ngram_max is not read by method auto" in str(err.value)
    defaults = SpecConfig(method="sd-draft", p_min=0.3)  # a server started with --method sd-draft --p-min 0.3
    spec = schemas.CompletionRequest(prompt="x", speculative={"method": "auto"}).spec(defaults, has_draft=True)
    assert spec.method == "auto" and spec.shared


def test_a_bench_warns_once_about_a_base_setting_no_swept_method_reads():
    assert BenchConfig(methods=["sd-ngram"], ks=[2], base=SpecConfig(p_min=0.3)).unused_settings() == ["--p-min"]
    assert BenchConfig(methods=["sd-draft"], ks=[2], base=SpecConfig(p_min=0.3)).unused_settings() == []


def test_the_old_name_proposer_still_sets_the_proposal_and_says_it_is_deprecated():
    with pytest.warns(DeprecationWarning, match="proposal="):
        spec = SpecConfig(method="auto", proposer="ngram")
    assert spec.proposal == "ngram"
    assert dataclasses.replace(spec, k=3).proposal == "ngram"
    with pytest.warns(DeprecationWarning, match=r"\.proposal"):
        assert spec.proposer == "ngram"
    with pytest.raises(InvalidRequestError, match="disagree"), pytest.warns(DeprecationWarning):
        SpecConfig(method="auto", proposer="ngram", proposal="suffix")
