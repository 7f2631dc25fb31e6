"""A property-based fuzz of the request schemas against a live toy server: bodies
built from the fields both endpoints declare, each with well-typed, out-of-range and
wrongly typed values. Every answer is a 200 or a 4xx in OpenAI's error shape; never a
5xx, never a traceback. Bounded: a fixed number of examples, no shrinking deadline."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclm.server import ServerConfig, create_app
from speclm.speculative.config import SpecConfig

from .test_server import C, CHAT, live, toy_llm

ANY = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                st.text(max_size=8), st.lists(st.integers(-3, 40), max_size=4),
                st.dictionaries(st.text(max_size=3), st.integers(-200, 200), max_size=3))
TEXT = st.text(alphabet="abcdefgh \n", min_size=0, max_size=12)
FIELDS = {
    "max_tokens": st.one_of(st.integers(-2, 6), ANY),
    "temperature": st.one_of(st.floats(-1, 3), ANY),
    "top_p": st.one_of(st.floats(0, 1.2), ANY),
    "presence_penalty": st.one_of(st.floats(-3, 3), ANY),
    "frequency_penalty": st.one_of(st.floats(-3, 3), ANY),
    "repetition_penalty": st.one_of(st.floats(-1, 3), ANY),
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["0", "3", "25", "26", "-1", "x"]),
                                            st.one_of(st.integers(-150, 150), st.floats()), max_size=3), ANY),
    "seed": st.one_of(st.integers(-1, 5), ANY),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3), ANY),
    "stream": st.one_of(st.booleans(), ANY),
    "speculative": st.one_of(st.fixed_dictionaries({}, optional={
        "method": st.sampled_from(["ar", "auto", "sd-suffix", "sd-ngram", "nope"]),
        "k": st.integers(-1, 40)}), ANY),
}
COMPLETION = {**FIELDS, "prompt": st.one_of(TEXT, st.lists(st.integers(-1, 30), max_size=5), ANY),
              "logprobs": st.one_of(st.integers(-1, 22), ANY), "echo": st.one_of(st.booleans(), ANY),
              "prediction": st.one_of(TEXT, ANY)}
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "robot"]),
                                 "content": st.one_of(TEXT, ANY)})
CHAT_FIELDS = {**FIELDS, "messages": st.one_of(st.lists(MESSAGE, min_size=0, max_size=3), ANY),
               "logprobs": st.one_of(st.booleans(), ANY), "top_logprobs": st.one_of(st.integers(-1, 22), ANY),
               "prediction": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["content", "x"]),
                                                              "content": st.one_of(TEXT, ANY)}), ANY)}


def bodies(fields: dict) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


@pytest.fixture(scope="module")
def url():
    llm = toy_llm()
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=2, default_spec=SpecConfig("auto", 4)))
    with live(app) as (url, _):
        yield url


def check(url: str, path: str, body: dict) -> None:
    r = httpx.post(url + path, content=json.dumps(body), headers={"Content-Type": "application/json"},
                   timeout=30)  # json.dumps: NaN and Infinity go out as clients' encoders may send them
    assert r.status_code < 500, (body, r.status_code, r.text)
    assert "Traceback" not in r.text and "server_error" not in r.text, (body, r.text)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, (body, err)


FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(body=bodies(COMPLETION))
def test_fuzzed_completion_requests_never_fail_the_server(url, body):
    check(url, C, body)


@FUZZ
@given(body=bodies(CHAT_FIELDS))
def test_fuzzed_chat_requests_never_fail_the_server(url, body):
    check(url, CHAT, body)


# ---- the grammar, tool, bias and prediction fields against SmolLM2 (issue 57) ----------
# Bodies a hostile or careless client sends: schemas with $ref chains past the depth at
# which llguidance 1.9.1 crashed (~925 links), wide anyOfs, counted regexes whose nesting
# multiplies, Lark rule chains, biases forcing what the grammar forbids or banning what it
# allows, token-id keys in every spelling, predictions with lone surrogates. After every
# case: no 5xx, every 400 names its field, /health answers within 2 s, the engine lives.
SMOL_VOCAB = 49152


@st.composite
def regexes(draw, counts: st.SearchStrategy[int], depth: int = 2) -> str:
    atom = draw(st.sampled_from(["a", "[0-9]", "(x|y)", r"\d", "[a-c]", ".", "ab"]))
    if depth and draw(st.booleans()):
        atom = f"({draw(regexes(counts, depth - 1))})"
    quant = draw(st.one_of(st.just(""), st.sampled_from(["*", "+", "?"]), counts.map(lambda n: f"{{{n}}}"),
                           st.tuples(counts, counts).map(lambda nm: f"{{{min(nm)},{max(nm)}}}")))
    tail = draw(regexes(counts, depth - 1)) if depth and draw(st.booleans()) else ""
    return atom + quant + tail


def _schema_chain(n: int, leaf: dict) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = leaf
    return {"$ref": "#/$defs/d0", "$defs": defs}


def hostile_bodies(heavy: bool) -> tuple[st.SearchStrategy[dict], st.SearchStrategy[dict]]:
    """(completion bodies, chat bodies); `heavy`: counts, anyOf widths and answers long
    enough to reach the compile time limit (seconds a case: the slow variant's)."""
    counts = st.one_of(st.integers(0, 12), st.integers(90, 2000 if heavy else 400))
    widths = [10, 1999, 2001, 5000] if heavy else [10, 2001]
    leaf = st.one_of(st.sampled_from([{"type": t} for t in ("integer", "string", "boolean", "null", "number")]),
                     st.builds(lambda r: {"type": "string", "pattern": f"^{r}$"}, regexes(counts)),
                     st.builds(lambda v: {"enum": v}, st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True)))
    schemas = st.recursive(leaf, lambda inner: st.one_of(
        st.builds(lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]},
                  st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3)),
        st.builds(lambda items, n: {"type": "array", "items": items, "minItems": min(n), "maxItems": max(n)},
                  inner, st.tuples(counts, counts)),
        st.builds(lambda alts: {"anyOf": alts}, st.lists(inner, min_size=1, max_size=3))), max_leaves=6)
    big_schemas = st.one_of(  # $ref chains on both sides of the bound and of llguidance's crash (~925 links)
        st.builds(_schema_chain, st.one_of(st.integers(0, 40), st.integers(100, 1200)), leaf),
        st.builds(lambda n: {"anyOf": [{"const": [i]} for i in range(n)]}, st.sampled_from(widths)))
    larks = st.one_of(
        st.integers(0, 6000).map(lambda n: "start: r0\n" + "\n".join(f'r{i}: "x" r{i + 1}' for i in range(n))
                                 + f'\nr{n}: "y"'),
        st.sampled_from(widths).map(lambda n: "start: " + " | ".join(f'"w{i}" "x{i}"' for i in range(n))),
        st.builds(lambda r: f"start: /{r}/ | %json {{\"type\": \"integer\"}}\n", regexes(counts)),
        st.text(alphabet='start:"|()/%json{}<>ab\n ', max_size=30))
    formats = st.one_of(
        st.sampled_from([None, {"type": "text"}, {"type": "json_object"}, {"type": "yaml"}, {"type": "regex"}]),
        st.builds(lambda sc: {"type": "json_schema", "json_schema": {"name": "x", "schema": sc}},
                  st.one_of(schemas, big_schemas)),
        st.builds(lambda r: {"type": "regex", "regex": r},
                  st.one_of(regexes(counts), st.sampled_from(["a[", "(", "a{2,1}"]))),
        st.builds(lambda g: {"type": "lark", "lark": g}, larks),
        ANY)
    keys = st.one_of(st.integers(0, SMOL_VOCAB - 1).map(str), st.sampled_from([str(t) for t in range(32, 42)]),
                     st.sampled_from(["0", "2", "4", "81", "49151", "49152", "99999", " 12 ", "00012",
                                      "\u0661\u0662", "-1", "+3", "1e3", "", "x", "9" * 30, "9" * 5000]))
    biases = st.one_of(
        st.dictionaries(keys, st.one_of(st.sampled_from([-100, 100, -100.0, 100.0, 5, -5, 0]),
                                        st.floats(-150, 150), st.booleans()), max_size=6),
        st.just({str(t): -100 for t in range(SMOL_VOCAB)}),  # every token banned
        st.just({**{str(t): 100 for t in range(32, 42)}, "0": -100, "2": -100, "4": -100}),  # digits, never the end
        ANY)
    predictions = st.one_of(st.text(max_size=12), st.sampled_from(["a\ud800b", "\udfff", "123" * 40]), ANY)
    tools = st.lists(st.builds(lambda name, params, strict: {"type": "function", "function": {
        "name": name, "parameters": params, "strict": strict}}, st.sampled_from(["f", "g", "bad name"]),
        st.one_of(schemas, big_schemas), st.booleans()), max_size=2)
    choices = st.one_of(st.sampled_from(["none", "auto", "required", "nope"]),
                        st.builds(lambda n: {"type": "function", "function": {"name": n}}, st.sampled_from("fgh")))
    common = {"response_format": formats, "logit_bias": biases, "temperature": st.sampled_from([0, 1]),
              "stream": st.booleans(),
              "speculative": st.sampled_from([{"method": "ar"}, {"method": "auto"}, {"method": "sd-suffix"}])}
    length = st.integers(1, 8 if heavy else 3)  # always set: a chat answer's default runs to the context's end
    completion = st.fixed_dictionaries({"prompt": st.sampled_from(["Digits:", "Hello", "a\ud800"]), "max_tokens": length},
                                       optional={**common, "prediction": predictions, "echo": st.booleans(),
                                                 "logprobs": st.sampled_from([None, 0, 2])})
    chat = st.fixed_dictionaries(
        {"messages": st.just([{"role": "user", "content": "Give three digits."}]), "max_tokens": length},
        optional={**common, "tools": tools, "tool_choice": choices,
                  "prediction": st.builds(lambda c: {"type": "content", "content": c}, predictions)})
    return completion, chat


HOSTILE_COMPLETION, HOSTILE_CHAT = hostile_bodies(heavy=False)


@pytest.fixture(scope="module")
def smol(smollm):
    app = create_app(smollm, ServerConfig(model_id="smollm2", max_concurrency=2))
    with live(app) as (url, _):
        yield url, app.state.speclm


def check_hostile(served, path: str, body: dict) -> None:
    url, state = served
    data = json.dumps(body).encode("utf-8", "surrogatepass")  # lone surrogates go out as JSON escapes
    r = httpx.post(url + path, content=data, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code < 500, (r.status_code, r.text[:500])
    assert "Traceback" not in r.text and "server_error" not in r.text, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["param"] is not None or "request body" in err["message"], err
    t = time.perf_counter()
    assert httpx.get(url + "/health", timeout=2).status_code == 200 and time.perf_counter() - t < 2
    assert state.engine.alive


HOSTILE_FUZZ = settings(max_examples=20, deadline=None, derandomize=True,
                        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                               HealthCheck.data_too_large])


@HOSTILE_FUZZ
@given(body=HOSTILE_COMPLETION)
def test_hostile_completion_bodies_never_fail_the_server(smol, body):
    check_hostile(smol, C, body)


@HOSTILE_FUZZ
@given(body=HOSTILE_CHAT)
def test_hostile_chat_bodies_never_fail_the_server(smol, body):
    check_hostile(smol, CHAT, body)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SPECLM_FUZZ_LONG"), reason="minutes: set SPECLM_FUZZ_LONG=1 to run it")
@settings(HOSTILE_FUZZ, max_examples=400)
@given(body=st.one_of(*(bodies.map(lambda b, p=path: (p, b)) for path, bodies in zip((C, CHAT), hostile_bodies(True)))))
def test_hostile_bodies_at_length(smol, body):
    """400 cases, with counts and anyOf widths up to llguidance's limits and the compile's
    time limit (about ten minutes on 2 cores)."""
    check_hostile(smol, *body)
