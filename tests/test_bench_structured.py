"""The bench's structured workloads: extract carries its JSON schema, tool-call its
functions; NAME+schema methods decode under the prompt's grammar and are measured
against ar+schema (constrained plain decoding); every answer is judged valid apart
from the grammar engine (docs/bench.md#structured-outputs)."""

from __future__ import annotations

import json

import pytest

from speclm import SamplingParams
from speclm.bench.analysis.groups import group_rows
from speclm.bench.analysis.ratios import pair_with_ar
from speclm.bench.analysis.validity import answer_valid
from speclm.bench.setup import methods, workloads
from speclm.constraints import check_grammar


@pytest.fixture(scope="module")
def qwen(qwen_small):
    return qwen_small


def test_extract_and_tool_call_prompts_carry_grammars_that_compile_on_qwens_vocabulary(qwen):
    for cat in ("extract", "tool-call"):
        prompts = workloads.builtin_prompts(cat)
        assert len(prompts) == 20 and all(p.grammar is not None and p.chat for p in prompts), cat
        for p in prompts:
            check_grammar(p.grammar, qwen.target)
    call = workloads.builtin_prompts("tool-call")[0]
    ids = call.encode(qwen)
    assert "get_weather" in qwen.target.detokenize(ids)  # the template showed the tools
    assert all(p.grammar is None for p in workloads.builtin_prompts("chat"))


def test_a_schema_method_constrains_its_answer_and_its_twin_does_not(qwen):
    prompt = workloads.builtin_prompts("tool-call")[2]
    known = methods.bench_methods()
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)  # the constrained arm drops ignore_eos
    ids = prompt.encode(qwen)
    constrained = known["ar+schema"].generate(qwen, ids, params, known["ar+schema"].spec(0), grammar=prompt.grammar)
    free = known["ar"].generate(qwen, ids, params, known["ar"].spec(0), grammar=prompt.grammar)
    assert answer_valid(prompt, constrained.text) and constrained.finish_reason == "stop"
    assert constrained.forced_tokens == 0 and free.forced_tokens is None  # plain decoding drafts nothing
    assert known["auto+schema"].baseline == "ar+schema" and known["auto"].baseline == "ar"
    assert [m.name for m in methods.parse_methods(["auto+schema", "auto"])] == ["ar", "ar+schema", "auto+schema",
                                                                                 "auto"]


def test_validity_is_judged_by_the_schema_not_the_engine():
    extract = workloads.builtin_prompts("extract")[0]
    good = {"name": "A", "date": "2024-03-03", "amount": 1.5, "currency": "GBP", "vendor": None, "items": []}
    assert answer_valid(extract, json.dumps(good))
    assert not answer_valid(extract, json.dumps({**good, "date": "3 March"}))
    assert not answer_valid(extract, json.dumps(good)[:-1])
    call = workloads.builtin_prompts("tool-call")[0]
    ok = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}\n</tool_call>'
    assert answer_valid(call, ok)
    assert not answer_valid(call, ok.replace("celsius", "kelvin"))
    assert not answer_valid(call, '{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}')


def _rec(method: str, index: int, wall: float, tokens: int, **kw) -> dict:
    return {"category": "extract", "prompt_index": index, "repeat": 0, "temperature": 0.0, "max_new_tokens": 64,
            "target": "t", "method": method, "k": 8, "wall_ms": wall, "prefill_ms": 10.0, "output_tokens": tokens,
            "prompt_tokens": 20, "proposed": kw.pop("proposed", 0), "accepted": kw.pop("accepted", 0),
            "emitted": tokens, "rounds": tokens, "full_accepts": 0, "pos_eligible": [], "pos_accepted": [],
            "rejection_hist": [], "tokens_per_s": 1000 * tokens / wall, "ttft_ms": 10.0, "tpot_ms": 1.0,
            "draft_ms": 0.0, "verify_ms": 0.0, "finish_reason": "stop", "valid": True, **kw}


def test_schema_rows_are_measured_against_constrained_plain_decoding():
    recs = [_rec("ar", 0, 100, 50), _rec("ar+schema", 0, 110, 40, forced_tokens=0, forced_proposed=0,
                                         forced_accepted=0),
            _rec("auto+schema", 0, 55, 40, forced_tokens=12, proposed=30, accepted=20, forced_proposed=14,
                 forced_accepted=12),
            _rec("auto", 0, 80, 50, proposed=20, accepted=10, valid=False)]
    pairs = {(m["method"], a["method"]) for m, a in pair_with_ar(recs)}
    assert pairs == {("ar+schema", "ar"), ("auto+schema", "ar+schema"), ("auto", "ar")}
    rows = {r["method"]: r for r in group_rows(recs)}
    assert rows["auto+schema"]["speedup"] == pytest.approx((110 / 40) / (55 / 40))
    s = rows["auto+schema"]["structured"]
    assert s["forced_share"] == pytest.approx(12 / 40) and s["rest_acceptance"] == pytest.approx(8 / 16)
    assert rows["auto"]["structured"]["valid"] == 0 and rows["auto"]["structured"]["forced_share"] is None
