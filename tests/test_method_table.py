"""The method table is the one place a method is defined: a method added with
ONE record is accepted by the API, `speclm generate`, `speclm serve`'s request
validation and the bench, and the table's settings drive every CLI's flags."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import httpx
import pytest

from speclm import LLM, SamplingParams, SpecConfig, SSDOptions
from speclm.backends.toy import ToyBackend
from speclm.commands import bench as bench_cli
from speclm.bench.setup import methods as bench_methods
from speclm.commands import build_parser
from speclm.commands.flags import spec_from_args
from speclm.errors import InvalidRequestError
from speclm.server import ServerConfig, create_app
from speclm.speculative.methods import METHODS, Method, Proposal, RequestSpec, register, unregister
from speclm.speculative.proposers.ngram import NgramProposer

from .test_server import live

NAME = "sd-ngram-fixed3"


@pytest.fixture
def fixed3() -> Iterator[str]:
    """A trivial method, defined by one record: prompt lookup pinned to n = 3."""
    register(Method(NAME, "prompt lookup pinned to n = 3 (a test-only method)",
                    proposal=Proposal("ngram3", lambda llm, spec: NgramProposer(3, 3), selectable=False)))
    try:
        yield NAME
    finally:
        unregister(NAME)
    assert NAME not in METHODS


def toy_llm() -> LLM:
    return LLM(target=ToyBackend(26, seed=4, n_ctx=256), draft=ToyBackend(26, seed=8, order=1, n_ctx=256))


def test_one_record_reaches_the_api_and_stays_lossless(fixed3):
    prompt = list(range(10)) * 3
    with toy_llm() as llm:
        ar = llm.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(method="ar"))
        out = llm.generate(prompt, SamplingParams(max_new_tokens=24), SpecConfig(method=fixed3, k=4))
    assert out.method == fixed3 and out.draft == "ngram[3..3]"
    assert out.token_ids == ar.token_ids  # greedy: identical to plain decoding on the toy backend


def test_one_record_reaches_generate_and_serve_flags(fixed3):
    for command in (["generate", "x"], ["serve"]):
        args = build_parser().parse_args([*command, "--method", fixed3, "--k", "5"])
        assert args.k == 5
        assert spec_from_args(args) == SpecConfig(method=fixed3, k=5)


def test_one_record_reaches_the_bench(fixed3):
    p = argparse.ArgumentParser(prog="speclm")
    bench_cli.add_bench_parser(p.add_subparsers(dest="command", required=True))
    cfg = bench_cli.resolve_args(p.parse_args(["bench", "--methods", fixed3, "--k", "3"]))["config"]
    assert [(m.name, k) for m, k in cfg.configs()] == [("ar", 0), (fixed3, 3)]
    assert not bench_methods.bench_method(fixed3).needs_draft


def test_one_record_reaches_the_server(fixed3):
    with toy_llm() as llm, live(create_app(llm, ServerConfig(model_id="toy", max_concurrency=2))) as (url, _):
        body = {"prompt": "abcabcabcabc", "max_tokens": 8, "temperature": 0,
                "speculative": {"method": fixed3, "k": 3}}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["speculative"]["method"] == fixed3
        r = httpx.post(url + "/v1/completions", json={**body, "speculative": {"method": "nope"}}, timeout=30)
        assert r.status_code == 400 and "unknown method 'nope'" in r.json()["error"]["message"]


def test_settings_are_declared_once_and_generate_every_cli():
    """Flags of generate, serve and bench come from SpecConfig's declared options:
    the same flag parses to the same setting in all three."""
    argv = ["--fanout", "3", "--ssd-width", "2", "--saguaro-c", "0.5", "--ngram-max", "6", "--p-min", "0.1"]
    want = SpecConfig(ngram_max=6, p_min=0.1, ssd=SSDOptions(fanout=3, width=2, saguaro_c=0.5))
    for command in (["generate", "x"], ["serve"], ["bench"]):
        assert spec_from_args(build_parser().parse_args([*command, *argv])) == want


def test_the_default_method_is_auto_everywhere():
    assert SpecConfig().method == "auto"
    for command in (["generate", "x"], ["serve"]):
        assert spec_from_args(build_parser().parse_args(command)).method == "auto"


def test_flat_option_names_set_nested_settings_and_unknown_ones_are_refused():
    spec = SpecConfig().with_options(method="ssd", fanout=5, k=3)
    assert (spec.method, spec.k, spec.ssd.fanout) == ("ssd", 3, 5)
    with pytest.raises(InvalidRequestError, match="unknown speculative option"):
        SpecConfig().with_options(fanot=5)
    with pytest.raises(InvalidRequestError, match="fanout"):
        SpecConfig().with_options(fanout=-1)


def test_what_the_factories_read_of_a_request_is_spec_config_fields_of_the_same_types():
    import dataclasses
    import typing

    read = {n: typing.get_type_hints(m.fget)["return"] for n, m in vars(RequestSpec).items()
            if isinstance(m, property)}
    hints = typing.get_type_hints(SpecConfig)
    assert read and set(read) <= {f.name for f in dataclasses.fields(SpecConfig)}
    # SpecConfig.k is declared int | None: None is resolved to the method's default on construction
    assert all(hints[n] in (t, t | None) for n, t in read.items())
