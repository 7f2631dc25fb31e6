"""Structured outputs under speculation: a grammar (JSON schema, regex, Lark) masks
every row of a verify block with the grammar's state after the draft prefix before
it, drafts are clipped to what the grammar allows, and the tokens it forces are
drafted for free (docs/design.md#structured-outputs).

Exact on the toy backend: a constrained greedy request emits what constrained
plain decoding emits, token for token, for every method and K, alone and batched;
every finished output is valid. The law of sampled constrained requests is the
harness's (tests/test_lossless_harness.py, the grammar cases).
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclm import LLM, Grammar, InvalidRequestError, SamplingParams, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.constraints import GrammarMask
from speclm.engine import Engine
from speclm.speculative.grammar_draft import shape_draft

from .test_lossless_harness import toy_heads

ALPHABET = '{}":, ab0123456789-+.E[]etrufnlsxyz$'  # JSON's punctuation, digits, true/false/null, a few letters; $ ends text
EOS = ALPHABET.index("$")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b", "ab"],
          "properties": {"a": {"type": "integer"}, "b": {"enum": ["ab", "ba", "xyz"]},
                         "ab": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}}}
METHODS = [("sd-draft", 1), ("sd-draft", 4), ("sd-ngram", 3), ("sd-suffix", 8), ("auto", 8), ("heuristic", 4),
           ("medusa", 3), ("ssd", 3)]


def toy(seed: int = 3, order: int = 2) -> ToyBackend:
    return ToyBackend(len(ALPHABET), seed=seed, order=order, sharpness=2.0, eos_id=EOS, alphabet=ALPHABET)


@pytest.fixture(scope="module")
def llm():
    target = toy()
    with LLM(target=target, draft=toy(seed=5, order=1), heads=toy_heads(target)) as llm:
        yield llm


def prompt(llm) -> list[int]:
    return llm.target.tokenize('{"a": 1, "b": "ab"} ')


def grammars() -> list[Grammar]:
    return [Grammar.json_schema(SCHEMA), Grammar.json_object(), Grammar.regex(r"(ab|ba){1,5}-[01]{2,4}(\.e)?"),
            Grammar.lark('start: "[" item (", " item)? (", " item)? "]"\n'
                         'item: "true" | "null" | %json{"type": "integer", "maximum": 99}')]


# ---- the mask ------------------------------------------------------------------------
def test_rows_where_the_grammar_allows_one_token_are_not_scored_and_change_nothing(llm, monkeypatch):
    """A row whose mask holds one token gives a one-hot p whatever its logits: the
    backend need not compute them (Round.certain; the base backend returns such rows as
    zeros, as llama.cpp does). Outputs, greedy and seeded, are those of every row scored
    (the law of unseeded sampling: the harness's grammar case, through the same zeros)."""
    seen = []
    certain_rows = GrammarMask.certain_rows

    def spy(self, tokens, candidates):
        rows = certain_rows(self, tokens, candidates)
        seen.extend(rows)
        for i in rows:  # each one is a one-token mask
            self.matcher.consume_tokens(list(tokens[:i])) if i else None
            assert np.count_nonzero(self.allowed()) == 1
            self.matcher.rollback(i) if i else None
        return rows
    runs = [(SpecConfig(method="sd-suffix", k=8), SamplingParams(max_new_tokens=64, grammar=g, **t))
            for g in grammars() for t in (dict(), dict(temperature=0.9, seed=4))]
    monkeypatch.setattr(GrammarMask, "certain_rows", spy)
    skipped = [llm.generate(prompt(llm), params, spec).token_ids for spec, params in runs]
    assert seen
    monkeypatch.setattr(GrammarMask, "certain_rows", lambda self, tokens, candidates: ())
    assert [llm.generate(prompt(llm), params, spec).token_ids for spec, params in runs] == skipped


def test_row_i_is_masked_with_the_grammar_state_after_the_drafts_before_it(llm):
    g = Grammar.json_schema(SCHEMA)
    rows = np.random.default_rng(0).standard_normal((5, len(ALPHABET)))
    draft = llm.target.tokenize('{"a')
    block = GrammarMask(g, llm.target).process(rows, draft + [EOS])
    for i in range(4):
        alone = GrammarMask(g, llm.target)
        alone.advance(draft[:i])
        allowed = alone.allowed()
        assert np.array_equal(block[i][allowed], rows[i][allowed]) and np.all(block[i][~allowed] == -np.inf), i
    assert np.flatnonzero(np.isfinite(block[0])).tolist() == [ALPHABET.index("{")]


def test_a_draft_is_clipped_at_its_first_forbidden_token_and_forced_tokens_follow(llm):
    from speclm.speculative.proposers.base import Draft
    mask = GrammarMask(Grammar.json_schema(SCHEMA), llm.target)
    d = Draft(llm.target.tokenize('{"a": 1x'), [None] * 8)
    forced_at = shape_draft(mask, d, 16, SamplingParams())
    assert llm.target.detokenize(d.tokens[:7]) == '{"a": 1'
    assert forced_at == [*range(6), *range(7, len(d))]  # the drafted '{"a": ' was forced too, as is the tail
    forced = llm.target.detokenize(d.tokens[7:])
    assert forced == "" or forced.startswith(",") or forced[0].isdigit()
    d = Draft(llm.target.tokenize('{"a": 12'), [None] * 8)
    shape_draft(mask, d, 16, SamplingParams())
    assert llm.target.detokenize(d.tokens) == '{"a": 12'  # a digit or ", " may follow: nothing forced
    d = Draft([], [])
    assert shape_draft(mask, d, 3, SamplingParams()) == [0, 1, 2] and llm.target.detokenize(d.tokens) == '{"a'  # room 3
    sampled = Draft(llm.target.tokenize('{x'), [np.full(len(ALPHABET), 1 / len(ALPHABET))] * 2)
    shape_draft(mask, sampled, 16, SamplingParams(temperature=1.0))
    assert len(sampled) == 2  # a drawn forbidden token stays: rejected, its residual drawn


def test_drafting_goes_on_after_a_forced_run_clipped_to_the_grammar():
    """A proposer's continuation after each forced run joins the block (its estimates and
    origins kept), clipped where the grammar forbids it; forced runs after it follow."""
    from speclm.speculative.proposers.base import Draft
    target = toy()
    mask = GrammarMask(Grammar.regex(r"x-(ab|ba)-[01]{3}"), target)
    asked: list[str] = []

    def extend(drafted: list[int], n: int) -> Draft:
        asked.append(target.detokenize(drafted))
        more = target.tokenize({"x-": "abz", "x-ab-": "10"}.get(asked[-1], ""))
        return Draft(more, [None] * len(more), [0.8] * len(more), match_len=3, support=(5,) * len(more),
                     source="own")

    d = Draft([], [], [])
    forced_at = shape_draft(mask, d, 16, SamplingParams(), extend)
    assert target.detokenize(d.tokens) == "x-ab-10" and asked == ["x-", "x-ab-"]  # "z" clipped, "-" forced
    assert forced_at == [0, 1, 3, 4]  # after the drafted "a" the grammar forces "b": marked as forced
    assert d.confidence == [1.0, 1.0, 0.8, 1.0, 1.0, 0.8, 0.8]
    assert [src for src, _ in d.origins] == ["grammar", "grammar", "own", "grammar", "grammar", "own", "own"]
    assert len(d.support) == len(d.q) == len(d)
    assert mask.valid_prefix(target.tokenize("x-ba-")) == 5  # the matcher's state is back where it was


def test_the_controller_verifies_a_forced_tail_only_where_the_drafts_before_it_pay():
    """Forced tokens are certain once reached: a block of a likely draft and the forced run
    after it is verified whole; behind an unlikely draft the forced rows would cost more
    than they bring (at a Zen-like curve), so the cut falls before them."""
    from speclm.costs import CostModel
    from speclm.speculative.controller import GoodputController
    from speclm.speculative.proposers.base import Draft
    target = toy()
    mask = GrammarMask(Grammar.regex(r"(ab|ba)-xyz-[01]"), target)
    curve = {1: 10.0, 2: 17.0, 4: 25.0, 8: 45.0, 16: 75.0}  # a 2-row verify costs 1.7 steps
    for estimate, whole in ((0.97, True), (0.2, False)):
        ctrl = GoodputController(CostModel(verify_ms=dict(curve), weight=0.0), k_max=16, per_position=True)
        # the proposer drafted "ab-" doubting its "b-"; the grammar forces "b-xyz-" after an "a"
        d = Draft(target.tokenize("ab-"), [None] * 3, [estimate, 0.1, 0.1], match_len=4, support=(50,) * 3,
                  source="own")
        forced_at = shape_draft(mask, d, 16, SamplingParams())
        assert forced_at == [1, 2, 3, 4, 5, 6] and target.detokenize(d.tokens) == "ab-xyz-"
        assert d.confidence[1:] == [1.0] * 6
        assert len(d.origins) == len(d.support) == len(d.confidence) == len(d)
        kept = ctrl.keep(d, 0)
        assert kept == (len(d) if whole else 0), (estimate, kept, ctrl.prefix_note)


# ---- exact under speculation ---------------------------------------------------------
@pytest.mark.parametrize("method,k", METHODS)
def test_constrained_greedy_speculation_equals_constrained_plain_decoding(llm, method, k):
    for grammar in grammars():
        params = SamplingParams(max_new_tokens=64, grammar=grammar)
        ar = llm.generate(prompt(llm), params, SpecConfig(method="ar"))
        sd = llm.generate(prompt(llm), params, SpecConfig(method=method, k=k))
        assert sd.token_ids == ar.token_ids, grammar
        assert sd.summary.rounds < ar.summary.rounds or method == "ssd"
    free = llm.generate(prompt(llm), SamplingParams(max_new_tokens=64), SpecConfig(method="ar"))
    assert free.text != ar.text  # the grammar bites


def test_constrained_outputs_are_valid_and_forced_tokens_are_drafted(llm):
    for grammar in grammars():
        params = SamplingParams(max_new_tokens=200, grammar=grammar)
        res = llm.generate(prompt(llm), params, SpecConfig(method="sd-suffix", k=8))
        assert res.finish_reason == "stop", (grammar, res.text)
        if grammar.kind == "json_schema":
            jsonschema.validate(json.loads(res.text), json.loads(grammar.text))
        elif grammar.kind == "regex":
            import re
            assert re.fullmatch(grammar.text, res.text), res.text
        assert 0 <= res.forced_tokens <= len(res.token_ids)
        assert res.forced_tokens > 0 or grammar.kind != "json_schema" or grammar == Grammar.json_object()
    ar = llm.generate(prompt(llm), params, SpecConfig(method="ar"))
    assert ar.forced_tokens == 0  # plain decoding drafts nothing, forced or not


def test_constrained_requests_batched_equal_each_alone(llm):
    settings_ = [dict(grammar=g) for g in grammars()] + [dict(), dict(grammar=grammars()[0], frequency_penalty=1.0)]
    spec = SpecConfig(method="sd-ngram", k=4)
    alone = [llm.generate(prompt(llm), SamplingParams(max_new_tokens=48, **s), spec) for s in settings_]
    engine = Engine(llm, max_concurrency=len(settings_))
    try:
        handles = [engine.submit(prompt(llm), SamplingParams(max_new_tokens=48, **s), spec) for s in settings_]
        batched = [h.result(60) for h in handles]
    finally:
        engine.shutdown()
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]


def test_a_seeded_constrained_request_emits_plain_decodings_text(llm):
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=11, grammar=grammars()[0])
    ar = llm.generate(prompt(llm), params, SpecConfig(method="ar"))
    for method, k in [("sd-draft", 4), ("sd-suffix", 8)]:
        assert llm.generate(prompt(llm), params, SpecConfig(method=method, k=k)).token_ids == ar.token_ids


@pytest.mark.parametrize("limit", [1, 3, 7])
def test_forced_runs_never_pass_max_tokens_or_the_context(limit):
    with LLM(target=ToyBackend(len(ALPHABET), seed=3, sharpness=2.0, eos_id=EOS, alphabet=ALPHABET, n_ctx=40),
             draft=toy(seed=5, order=1)) as small:
        p = small.target.tokenize('{"a": 1}')
        res = small.generate(p, SamplingParams(max_new_tokens=limit, grammar=grammars()[0]),
                             SpecConfig(method="sd-suffix", k=8))
        assert len(res.token_ids) == limit and res.finish_reason == "length"
        res = small.generate(p, SamplingParams(max_new_tokens=40 - len(p), grammar=Grammar.regex("(ab|ba)+")),
                             SpecConfig(method="sd-suffix", k=8))
        assert len(p) + len(res.token_ids) <= 40


# ---- fuzzed schemas -------------------------------------------------------------------
KEYS = st.sampled_from(["a", "b", "ab", "ba", "x", "yz"])
LEAVES = st.one_of(
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 999)),
    st.just({"type": "number", "minimum": -10, "maximum": 10}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 4)),
    st.builds(lambda vals: {"enum": vals}, st.lists(st.sampled_from(["ab", "x", "tru", "nul"]), min_size=1,
                                                      max_size=3, unique=True)),
    st.just({"type": "string", "format": "date"}))


def _object(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


SCHEMAS = st.recursive(LEAVES, lambda inner: st.one_of(
    st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, inner, st.integers(0, 3)),
    st.builds(_object, st.dictionaries(KEYS, inner, min_size=1, max_size=3))), max_leaves=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(0, 3))
def test_every_output_of_a_fuzzed_schema_validates(llm, schema, seed):
    """Nested objects, arrays, enums, bounded numbers, strings with formats: a finished
    output parses and validates; speculation emits constrained plain decoding's tokens."""
    params = SamplingParams(max_new_tokens=300, temperature=1.0, seed=seed, grammar=Grammar.json_schema(schema))
    res = llm.generate(prompt(llm), params, SpecConfig(method="sd-suffix", k=8))
    if res.finish_reason == "stop":
        jsonschema.validate(json.loads(res.text), schema, format_checker=jsonschema.FormatChecker())
    assert res.token_ids == llm.generate(prompt(llm), params, SpecConfig(method="ar")).token_ids


# ---- bad input --------------------------------------------------------------------------
def test_bad_grammars_are_refused_with_the_engines_message(llm):
    cases = [(Grammar.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}), "nope"),
             (Grammar.regex("a["), "regex"), (Grammar.lark("start: missing_rule"), "missing_rule")]
    for grammar, words in cases:
        with pytest.raises(InvalidRequestError, match="cannot be compiled") as e:
            llm.generate(prompt(llm), SamplingParams(grammar=grammar), SpecConfig(method="sd-suffix"))
        assert words in str(e.value)
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        Grammar.json_schema("{nope")
    with pytest.raises(InvalidRequestError, match="kind must be one of"):
        Grammar("gbnf", "root ::= x")
    with pytest.raises(InvalidRequestError, match="ignore_eos"):
        SamplingParams(grammar=Grammar.json_object(), ignore_eos=True)
    with LLM(target=ToyBackend(6, seed=1)) as no_eos:
        with pytest.raises(InvalidRequestError, match="no end-of-text token"):
            no_eos.generate([0, 1], SamplingParams(grammar=Grammar.regex("ab")), SpecConfig(method="ar"))


# ---- no token left (logit_bias x grammar): docs/design.md#processed-distributions -------
DIGITS = [ALPHABET.index(c) for c in "0123456789"]
LATE = dict(grammar=Grammar.regex("[0-9]{3}"), logit_bias={**{t: 100 for t in DIGITS}, EOS: -100})


@pytest.mark.parametrize("method,k", METHODS)
def test_a_row_with_no_token_left_stops_the_request_where_plain_decoding_does(llm, method, k):
    """Forcing the digits and banning the end token: after three digits the grammar allows
    only the end, which is banned. Plain decoding and every method emit the same three
    digits, never a banned token, and stop with finish_reason content_filter."""
    for sampling in (dict(), dict(temperature=1.0, seed=5)):
        params = SamplingParams(max_new_tokens=12, **sampling, **LATE)
        ar = llm.generate(prompt(llm), params, SpecConfig(method="ar"))
        sd = llm.generate(prompt(llm), params, SpecConfig(method=method, k=k))
        assert ar.finish_reason == sd.finish_reason == "content_filter"
        assert sd.token_ids == ar.token_ids and len(ar.token_ids) == 3 and set(ar.token_ids) <= set(DIGITS)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, **LATE)  # unseeded: any digits, the same stop
    for _ in range(3):
        res = llm.generate(prompt(llm), params, SpecConfig(method=method, k=k))
        assert res.finish_reason == "content_filter" and len(res.token_ids) == 3 and set(res.token_ids) <= set(DIGITS)


def test_an_empty_row_inside_a_draft_accepts_the_tokens_before_it_and_stops(llm, monkeypatch):
    """Row i of a block with no token left: the draft's tokens before it are accepted or
    rejected as usual (rejected: the request goes on), all accepted: the request stops."""
    from speclm.speculative.loop import Generation
    real = Generation.distributions
    cut = {"at": None}

    def emptied(self, rows, draft):
        p = real(self, rows, draft)
        if cut["at"] is not None and len(p) > cut["at"] + 1 and len(self.stops.token_ids) >= 2:
            p[cut["at"]] = None
            cut["at"] = None  # once
        return p

    monkeypatch.setattr(Generation, "distributions", emptied)
    ids = llm.target.tokenize('{"a": 1, "b": "ab"} {"a": 1, "b": "ab"} ')
    params = SamplingParams(max_new_tokens=40, grammar=Grammar.json_schema(SCHEMA))
    full = llm.generate(ids, params, SpecConfig(method="sd-suffix", k=8))
    cut["at"] = 2
    res = llm.generate(ids, params, SpecConfig(method="sd-suffix", k=8))
    assert res.finish_reason == "content_filter" and res.token_ids == full.token_ids[:len(res.token_ids)]


def test_conflicts_decided_at_the_first_token_are_errors(llm):
    grammar = Grammar.regex("[0-9]{3}")
    a = ALPHABET.index("a")
    cases = [(dict(grammar=grammar, logit_bias={a: 100}), "forces .* does not allow as the first token"),
             (dict(grammar=grammar, logit_bias={t: -100 for t in DIGITS}), "bans .* every token the grammar allows"),
             (dict(logit_bias={t: -100 for t in range(len(ALPHABET))}), "every token of the vocabulary")]
    for settings_, words in cases:
        for method in ("ar", "auto"):
            with pytest.raises(InvalidRequestError, match=words):
                llm.generate(prompt(llm), SamplingParams(max_new_tokens=4, **settings_), SpecConfig(method=method))
    ok = llm.generate(prompt(llm), SamplingParams(max_new_tokens=4, grammar=grammar,
                                                  logit_bias={DIGITS[3]: 100, EOS: 100}), SpecConfig(method="auto"))
    assert ok.text == "333" and ok.finish_reason == "stop"  # +100 leaves the forced tokens only: the end among them
