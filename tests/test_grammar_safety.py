"""Grammar compilation cannot take the process down (speclm/grammar_safety.py,
docs/server.md#structured-outputs): bounds first, then the compile worker, then this
process on a big stack, every verdict kept by the grammar's text.

The crash itself (llguidance 1.9.1 overflows its stack on a $ref chain ~1000 deep and
dies with SIGSEGV) is only ever provoked in throwaway child processes here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
import time

import numpy as np
import pytest

from speclm import Grammar, InvalidRequestError
from speclm import grammar_safety as gs
from speclm.constraints import GrammarMask, check_grammar, first_allowed, matcher_for
from speclm.grammar_bounds import MAX_DEPTH, check_bounds, regex_repeat

from .test_structured import toy


def chain(n: int, link: str = "props") -> dict:
    """d0.a -> d1 -> ... -> dn: a $defs chain of n links."""
    def one(i):
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        return {"props": {"type": "object", "properties": {"a": ref}}, "bare": ref,
                "items": {"type": "array", "items": ref}}[link]
    defs = {f"d{i}": one(i) for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(n: int) -> str:
    return "start: r0\n" + "\n".join(f'r{i}: "x" r{i + 1}' for i in range(n)) + f'\nr{n}: "y"'


# ---- 1. the bounds -----------------------------------------------------------------------
@pytest.mark.parametrize("n", [1000, 2000])
def test_a_ref_chain_over_the_depth_bound_is_refused_before_anything_compiles(n):
    with pytest.raises(InvalidRequestError, match=f"nests deeper .* limit of {MAX_DEPTH} levels"):
        check_bounds("json_schema", json.dumps(chain(n)))


def test_a_chain_of_10000_links_is_over_the_size_bound():
    with pytest.raises(InvalidRequestError, match="characters long, over speclm's limit"):
        check_bounds("json_schema", json.dumps(chain(10_000)))


def test_depth_follows_refs_but_not_recursion():
    check_bounds("json_schema", json.dumps(chain(150)))  # 3 levels a link: 450
    check_bounds("json_schema", json.dumps(chain(500, "bare")))
    with pytest.raises(InvalidRequestError):
        check_bounds("json_schema", json.dumps(chain(200)))
    recursive = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}}
    check_bounds("json_schema", json.dumps(recursive))  # a tree schema refers to itself: recursion, not depth
    dag = {"$ref": "#/$defs/d0", "$defs": {f"d{i}": {"type": "object", "properties": {
        "a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(40)}}
    dag["$defs"]["d40"] = {"type": "integer"}
    check_bounds("json_schema", json.dumps(dag))  # 2^40 paths, measured once per definition


def test_lark_rule_chains_are_bounded_and_their_json_schemas_count():
    check_bounds("lark", lark_chain(400))
    with pytest.raises(InvalidRequestError, match="chains rule references"):
        check_bounds("lark", lark_chain(5000))
    deep = f"start: %json {json.dumps(chain(150))}\n"
    check_bounds("lark", deep)
    with pytest.raises(InvalidRequestError):
        check_bounds("lark", lark_chain(100).replace('r100: "y"', f"r100: %json {json.dumps(chain(150))}"))


@pytest.mark.parametrize("pattern,repeat", [
    ("a{5}b{7}", 7), ("(a{100}){30}", 3000), ("((a{100}b){100}c){100}", 1_000_000), ("[{}]{3}", 3),
    (r"\d{4}-\p{L}{2}", 4), ("(?:ab){10}(?P<x>c{5}){2}", 10), ("a*b+c?", 1), ("x{2,9}", 9), ("x{99999999999999}", 10**12),
    (r"[a\]{}]{3}", 3), ("a{", 1),
])
def test_regex_repetition_is_the_product_of_nested_counts(pattern, repeat):
    assert regex_repeat(pattern) == repeat


def test_counted_repetition_bounds_regexes_patterns_and_lark():
    with pytest.raises(InvalidRequestError, match="repeats a pattern 1000000 times"):
        check_bounds("regex", "(a{1000}){1000}")
    with pytest.raises(InvalidRequestError, match="repeats a pattern"):
        check_bounds("json_schema", json.dumps({"type": "string", "pattern": "^(a{1000}){1000}$"}))
    with pytest.raises(InvalidRequestError, match="repeats a pattern"):
        check_bounds("lark", 'start: a{1000}\na: /b{1000}/\n')  # across a rule reference
    check_bounds("regex", "[0-9]{100000}")
    check_bounds("lark", 'start: "a"{3} /x{20}/\n')


# ---- 2. the worker: a crash costs one grammar, never the process ------------------------
CHILD = textwrap.dedent("""
    import json, sys, time
    import speclm.constraints as C
    from speclm import grammar_safety as gs
    from speclm.constraints import Grammar, check_grammar
    from tests.test_grammar_safety import chain
    from tests.test_structured import toy
    C.check_bounds = lambda kind, text: None  # the bounds off: the worker alone stands between
    backend, out = toy(), []
    for n in [5, 2000, 10000, 5]:
        t = time.perf_counter()
        try:
            check_grammar(Grammar.json_schema(chain(n)), backend)
            verdict = "ok"
        except Exception as e:
            verdict = f"{type(e).__name__}: {e}"
        out.append([n, verdict, round(time.perf_counter() - t, 3), gs.WORKER.starts])
    print(json.dumps(out))
""")


def test_a_compile_that_crashes_llguidance_costs_the_grammar_not_the_process():
    """Bounds off (in a throwaway child process): the $ref chains that SIGSEGV llguidance
    kill only the compile worker; the process answers each with InvalidRequestError,
    restarts the worker and compiles the next grammar."""
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row[1] for row in rows][0] == "ok" and rows[-1][1] == "ok", rows
    for n, verdict, _, _ in rows[1:3]:
        assert "crashed on it (SIGSEGV)" in verdict and "cannot be compiled" in verdict, rows
    assert rows[-1][3] >= 2  # the worker was started again


def test_a_compile_over_the_time_limit_is_an_error_and_the_worker_restarts(monkeypatch):
    backend = toy()
    check_grammar(Grammar.regex("a{3}"), backend)  # the worker is up and holds the vocabulary
    starts = gs.WORKER.starts
    monkeypatch.setattr(gs, "COMPILE_TIMEOUT_S", 0.0)
    with pytest.raises(InvalidRequestError, match=r"cannot be compiled: it took over 0 s"):
        check_grammar(Grammar.regex("(ab|ba){1,4}-[01]{2}"), backend)
    monkeypatch.setattr(gs, "COMPILE_TIMEOUT_S", 5.0)
    check_grammar(Grammar.regex("(ab|ba){1,4}-[01]{3}"), backend)
    assert gs.WORKER.starts > starts


# ---- 3. the cache: a grammar seen before costs nothing more -------------------------------
def test_compiled_grammars_and_errors_are_kept_by_their_text(monkeypatch):
    backend = toy()
    calls = []
    real = gs.WORKER.check
    monkeypatch.setattr(gs.WORKER, "check", lambda *a: calls.append(a[2]) or real(*a))
    grammar = Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    first = matcher_for(grammar, backend)
    t = time.perf_counter()
    for _ in range(100):
        assert matcher_for(Grammar.json_schema(json.loads(grammar.text)), backend) is first
    assert (time.perf_counter() - t) / 100 < 1e-3 and len(calls) == 1
    bad = Grammar.regex("a[")
    for _ in range(3):
        with pytest.raises(InvalidRequestError, match="cannot be compiled"):
            check_grammar(bad, backend)
    assert len(calls) == 2
    a, b = GrammarMask(grammar, backend), GrammarMask(grammar, backend)  # copies: independent states
    a.advance([a.matcher.compute_ff_tokens()[0]])
    assert not np.array_equal(a.allowed(), b.allowed())
    assert np.array_equal(b.allowed(), first_allowed(grammar, backend))


# ---- 4. llguidance's limits at the first steps are errors before any answer ---------------
@pytest.mark.parametrize("grammar", [
    Grammar.json_schema({"anyOf": [{"const": [i]} for i in range(5000)]}),
    Grammar.lark("start: " + " | ".join(f'"w{i}" "x{i}"' for i in range(5000))),  # after the forced "w"
])
def test_grammars_over_llguidances_limits_fail_at_compile(smollm, grammar):
    with pytest.raises(InvalidRequestError, match="cannot be compiled: .*items; max is 2000"):
        check_grammar(grammar, smollm.target)


def test_errors_carry_no_parser_dump(smollm):
    with pytest.raises(InvalidRequestError) as err:
        check_grammar(Grammar.lark('start: <tool_call> "x"'), smollm.target)
    assert "<state>" not in str(err.value) and len(str(err.value)) < 600


def test_the_worker_compiles_against_the_models_own_tokenizer(smollm):
    """A llama.cpp model's vocabulary is loaded by the worker itself: the two tokenizers
    agree, so the worker's verdict is this process's."""
    grammar = Grammar.regex("(ab){5}")  # a forced run: tokenized by the model's tokenizer
    check_grammar(grammar, smollm.target)
    assert first_allowed(grammar, smollm.target).sum() >= 1
