"""The OpenAI-compatible server end to end: the real `openai` client and httpx
against live uvicorn servers on 127.0.0.1. SmolLM2-135M drives the real path;
exact toy models are used where outputs must match exactly or time matters."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from speclm import LLM, SpecConfig
from speclm.backends.toy import TOY_ALPHABET, ToyBackend
from speclm.server import ServerConfig, create_app
from speclm.errors import InvalidRequestError
from speclm.models.registry import REGISTRY
from speclm.commands.serve import Server, add_serve_parser, build_app, cmd_serve
from speclm.server.tenants import split_keys, tenant_id
from speclm.speculative.methods import DEFAULT_METHOD

C, CHAT = "/v1/completions", "/v1/chat/completions"


@contextmanager
def live(app, uvicorn_config: uvicorn.Config | None = None, **config) -> Iterator[tuple[str, Server]]:
    """Serve `app` on a free loopback port in a background thread, under `uvicorn_config`
    (its host and port aside) or one made of `config` (uvicorn.Config's keywords)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn_config or uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def toy_llm() -> LLM:
    return LLM(target=ToyBackend(26, seed=4, n_ctx=256), draft=ToyBackend(26, seed=8, order=1, n_ctx=256))


class SlowToy(ToyBackend):
    """A toy target whose forwards take `delay_s` (3 ms): requests last long enough to race."""

    def __init__(self, *args, delay_s: float = 0.003, **kw):
        super().__init__(*args, **kw)
        self.delay_s = delay_s

    def score(self, seq, tokens):
        time.sleep(self.delay_s)
        return super().score(seq, tokens)


def wait_until(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def sse_events(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


@pytest.fixture(scope="module")
def smol():
    llm = LLM(target="smollm2-135m", n_threads=1, max_sequences=20, n_ctx=1024)
    app = create_app(llm, ServerConfig(model_id="smollm2", max_concurrency=8,
                                       default_spec=SpecConfig("sd-ngram", 3)))
    with live(app) as (url, _):
        yield llm, url, app
    llm.close()


@pytest.fixture(scope="module")
def toy():
    llm = toy_llm()
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=8, default_spec=SpecConfig("sd-draft", 3)))
    with live(app) as (url, _):
        yield llm, url, app


# ---- the real path -----------------------------------------------------------
def test_completion_stream_equals_non_stream(smol):
    _, url, _ = smol
    kw = dict(model="smollm2", prompt="def fibonacci(n):\n", max_tokens=32, temperature=0)
    full = client(url).completions.create(**kw)
    text = full.choices[0].text
    assert text and full.object == "text_completion" and full.choices[0].finish_reason in ("stop", "length")
    u = full.usage
    assert 0 < u.completion_tokens <= 32 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    spec = u.model_extra["speculative"]
    assert spec["method"] == "sd-ngram" and spec["k"] == 3
    assert set(spec) == {"method", "k", "acceptance_rate", "mean_acceptance_length", "drafted", "accepted",
                         "cache_hit_rate"}
    assert spec["cache_hit_rate"] is None  # SSD's alone
    chunks = list(client(url).completions.create(**kw, stream=True))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_chat_stream_equals_non_stream(smol):
    _, url, _ = smol
    kw = dict(model="smollm2", max_tokens=40, temperature=0, messages=[
        {"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is 2+2?"}])
    full = client(url).chat.completions.create(**kw)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content and full.object == "chat.completion"
    assert full.usage.model_extra["speculative"]["method"] == "sd-ngram"
    chunks = list(client(url).chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-2].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    streamed, whole = chunks[-1].usage.model_extra["speculative"], full.usage.model_extra["speculative"]
    assert (streamed["drafted"], streamed["accepted"]) == (whole["drafted"], whole["accepted"])  # greedy, same drafts


def test_models_and_health(smol):
    llm, url, _ = smol
    models = client(url).models.list().data
    assert [m.id for m in models] == ["smollm2"]
    ext = models[0].model_extra["speclm"]
    smol = REGISTRY["smollm2-135m"]
    assert ext["target"] == ext["lossless_against"] == {"name": smol.name, "sha256": smol.sha256}
    assert str(llm.target.path.parent) not in str(ext)  # the name and sha256, not where the file lies
    assert ext["draft"] is None and ext["default_speculative"] == {"method": "sd-ngram", "k": 3}
    assert httpx.get(url + "/v1/models/smollm2").json()["id"] == "smollm2"
    missing = httpx.get(url + "/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    health = httpx.get(url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


LONG = "hello " * 1100  # > 1024 tokens: over the smollm fixture's context
BAD_INPUTS = [
    ("malformed JSON", C, b'{"prompt": "hi",', 400, "not valid json"),
    ("body not an object", C, b"[1, 2]", 400, "json object"),
    ("empty body", C, b"", 400, "json object"),
    ("prompt wrong type", C, {"prompt": 5}, 400, "prompt"),
    ("max_tokens a string", C, {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("max_tokens a bool", C, {"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
    ("max_tokens 0", C, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens too large", C, {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),
    ("max_tokens past the context", C, {"prompt": "hi", "max_tokens": 1024}, 400, "context"),
    ("temperature -1", C, {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("temperature a string", C, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("top_p 2", C, {"prompt": "hi", "top_p": 2}, 400, "top_p"),
    ("top_p 0", C, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("top_k -1", C, {"prompt": "hi", "top_k": -1}, 400, "top_k"),
    ("min_p 1", C, {"prompt": "hi", "min_p": 1.0}, 400, "min_p"),
    ("seed -1", C, {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("stop wrong type", C, {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("stop empty string", C, {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("n 2", C, {"prompt": "hi", "n": 2}, 400, "n > 1 is not supported"),
    ("unknown model", C, {"model": "gpt-4", "prompt": "hi"}, 404, "does not exist"),
    ("empty prompt", C, {"prompt": ""}, 400, "empty"),
    ("blank prompt", C, {"prompt": "  \n"}, 400, "empty"),
    ("empty prompt list", C, {"prompt": []}, 400, "prompt"),
    ("token id out of range", C, {"prompt": [10**9]}, 400, "token ids"),
    ("missing prompt", C, {"max_tokens": 3}, 400, "prompt"),
    ("max_completion_tokens 0", CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                       "max_completion_tokens": 0}, 400, "max_completion_tokens must be in"),
    ("max_completion_tokens past the context", CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                                      "max_completion_tokens": 1020}, 400,
     "lower max_completion_tokens"),
    ("prompt over the context", C, {"prompt": LONG}, 400, "context"),
    ("stream wrong type", C, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("invalid request with stream", C, {"prompt": "hi", "stream": True, "max_tokens": 0}, 400, "max_tokens"),
    ("logprobs over 20", C, {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("unknown method", C, {"prompt": "hi", "speculative": {"method": "magic"}}, 400, "speculative"),
    ("k out of range", C, {"prompt": "hi", "speculative": {"method": "sd-ngram", "k": 0}}, 400, "k must"),
    ("sd-draft without a draft", C, {"prompt": "hi", "speculative": {"method": "sd-draft"}}, 400, "draft"),
    ("unknown speculative field", C, {"prompt": "hi", "speculative": {"kk": 1}}, 400, "kk"),
    ("missing messages", CHAT, {"max_tokens": 3}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("bad role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("content wrong type", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("image content", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
    ("blank chat", CHAT, {"messages": [{"role": "user", "content": " "}]}, 400, "empty"),
    ("chat over the context", CHAT, {"messages": [{"role": "user", "content": LONG}]}, 400, "context"),
    ("oversized body", C, {"prompt": "a" * (1 << 20)}, 413, "exceeds"),
]


@pytest.mark.parametrize("name,path,body,status,needle", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_a_4xx_with_an_openai_error(smol, name, path, body, status, needle):
    _, url, _ = smol
    if isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    else:
        r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    assert needle.lower() in err["message"].lower() or needle == err["param"], err


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
UNSUPPORTED = {  # field -> a value that asks for something speclm does not do (tools: test_server_structured.py)
    "functions": [TOOL["function"]], "function_call": {"name": "f"},
    "messages[1].function_call": {"name": "f", "arguments": "{}"},
}


@pytest.mark.parametrize("field", UNSUPPORTED)
def test_each_unsupported_field_is_a_400_naming_it(toy, field):
    """The deprecated function-calling fields are refused, field by field, not silently ignored."""
    _, url, _ = toy
    messages = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "d"},
                {"role": "user", "content": "e"}]
    name = field.rpartition(".")[2]
    if field.startswith("messages[1]."):
        messages[1] = {**messages[1], name: UNSUPPORTED[field]}
    kw = {} if field.startswith("messages") else {field: UNSUPPORTED[field]}
    with pytest.raises(openai.BadRequestError) as err:
        client(url).chat.completions.create(model="toy", messages=messages, max_tokens=3, **kw)
    assert err.value.param == field and f"{field} is not supported" in err.value.message
    asks_nothing = {"tools": [], "tool_choice": "none", "functions": [], "function_call": "none"}
    for field, value in asks_nothing.items():  # a value that asks for nothing is served
        r = httpx.post(url + CHAT, json={"messages": messages[:1], "max_tokens": 3, field: value})
        assert r.status_code == 200, r.text


def test_unknown_routes_chunked_oversize_and_openai_errors(smol):
    _, url, _ = smol
    for r, status in [(httpx.get(url + "/v1/nope"), 404), (httpx.get(url + C), 405),
                      (httpx.post(url + C, content=iter([b"{" + b" " * (1 << 20), b"}"])), 413)]:
        assert r.status_code == status and "message" in r.json()["error"]
    with pytest.raises(openai.BadRequestError, match="n > 1 is not supported"):
        client(url).completions.create(model="smollm2", prompt="hi", n=2)
    with pytest.raises(openai.NotFoundError):
        client(url).completions.create(model="gpt-4", prompt="hi")


def test_disconnect_mid_stream_frees_the_sequence(smol):
    llm, url, app = smol
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", url + C, json=body) as r:
        first = json.loads(next(sse_events(r)))
        assert first["object"] == "text_completion" and llm.target.live_sequences >= 1
    assert wait_until(lambda: llm.target.live_sequences == 0 and app.state.speclm.engine.load == (0, 0))


def test_concurrent_real_requests_finish_without_leaks(smol):
    llm, url, _ = smol
    out: list[str] = []

    def one(i: int) -> None:
        r = client(url).completions.create(model="smollm2", prompt=f"Item {i}:", max_tokens=12, temperature=0,
                                           extra_body={"speculative": {"method": ("ar", "sd-ngram")[i % 2]}})
        out.append(r.choices[0].text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 4 and wait_until(lambda: llm.target.live_sequences == 0)


# ---- exact toy models ----------------------------------------------------------
def scrape(url: str, **headers) -> dict[tuple, float]:
    r = httpx.get(url + "/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def test_metrics_count_what_the_responses_report(toy):
    _, url, _ = toy
    before = scrape(url)
    usages = [client(url).completions.create(model="toy", prompt="abcab", max_tokens=30, temperature=0.8,
                                             seed=i).usage for i in range(3)]
    httpx.post(url + C, json={"prompt": "abc", "max_tokens": 0})
    after = scrape(url)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    spec = [u.model_extra["speculative"] for u in usages]
    assert delta("speclm_requests_total", route=C, status="200") == 3
    assert delta("speclm_requests_total", route=C, status="400") == 1
    assert delta("speclm_completion_tokens_total", method="sd-draft") == sum(u.completion_tokens for u in usages)
    assert delta("speclm_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("speclm_spec_drafted_tokens_total", method="sd-draft") == sum(s["drafted"] for s in spec) > 0
    assert delta("speclm_spec_accepted_tokens_total", method="sd-draft") == sum(s["accepted"] for s in spec)
    assert delta("speclm_spec_position_proposed_total", method="sd-draft", position="1") > 0
    assert delta("speclm_time_to_first_token_seconds_count", method="sd-draft") == 3
    assert delta("speclm_request_duration_seconds_count", route=C) == 4
    rate = after[("speclm_spec_acceptance_rate", (("method", "sd-draft"),))]
    assert 0.0 <= rate <= 1.0
    accepted = after[("speclm_spec_accepted_tokens_total", (("method", "sd-draft"),))]
    drafted = after[("speclm_spec_drafted_tokens_total", (("method", "sd-draft"),))]
    assert rate == pytest.approx(accepted / drafted)


def test_greedy_output_is_identical_across_methods(toy):
    """Lossless through the server: on the exact toy model every method gives AR's text."""
    _, url, _ = toy
    texts = set()
    for spec in ({"method": "ar"}, {"method": "sd-draft", "k": 4}, {"method": "sd-ngram", "k": 2}):
        r = client(url).completions.create(model="toy", prompt="abcabc", max_tokens=40, temperature=0,
                                           extra_body={"speculative": spec})
        s = r.usage.model_extra["speculative"]
        assert s["method"] == spec["method"] and s["k"] == spec.get("k", 0)
        texts.add(r.choices[0].text)
    assert len(texts) == 1


def test_sixteen_concurrent_streams_match_their_solo_runs(toy):
    llm, url, app = toy
    reqs = [dict(model="toy", prompt="".join(TOY_ALPHABET[(i * j + 1) % 26] for j in range(3 + i)),
                 max_tokens=60 + 5 * i, temperature=0.9, seed=100 + i,
                 extra_body={"speculative": {"method": ("sd-draft", "sd-ngram", "ar")[i % 3], "k": 2 + i % 3}})
            for i in range(16)]
    solo = [client(url).completions.create(**r).choices[0].text for r in reqs]
    got: dict[int, str] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            got[i] = "".join(c.choices[0].text for c in client(url).completions.create(**reqs[i], stream=True))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not errors and not any(t.is_alive() for t in threads)
    assert [got[i] for i in range(16)] == solo
    assert wait_until(lambda: app.state.speclm.engine.load == (0, 0))
    assert llm.target.live_sequences == 0 and llm.draft.live_sequences == 0


def test_api_key_guards_v1_only():
    """/metrics is the operator's, loopback's without an operator key (test_server_access.py)."""
    with live(create_app(toy_llm(), ServerConfig(model_id="toy", api_key="sekret"))) as (url, _):
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="toy", prompt="abc", max_tokens=3)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            r = httpx.get(url + "/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
        r = client(url, "sekret").completions.create(model="toy", prompt="abc", max_tokens=3)
        assert len(r.choices[0].text) == 3
        assert httpx.get(url + "/health").status_code == 200


def test_each_api_key_drafts_only_from_its_own_outputs():
    """Tenants: key B never drafts from key A's outputs (acceptance timing would leak
    them); sharing is an opt-in; /metrics shows each tenant's cache; an admin call
    clears the caller's cache only, and needs a key."""
    req = dict(model="toy", prompt="abcab", max_tokens=60, temperature=0,
               extra_body={"speculative": {"method": "sd-suffix", "k": 8}})
    a_id, b_id = tenant_id("key-a"), tenant_id("key-b")

    def accepted(url: str, key: str) -> int:
        return client(url, key).completions.create(**req).usage.model_extra["speculative"]["accepted"]

    with live(create_app(toy_llm(), ServerConfig(model_id="toy", api_keys=("key-a", "key-b")))) as (url, _):
        fresh = accepted(url, "key-a")
        assert accepted(url, "key-b") == fresh  # A's output is not in B's cache
        warm = accepted(url, "key-a")
        assert warm > fresh  # ... but it is in A's own
        m = scrape(url, Authorization="Bearer key-b")
        assert m[("speclm_suffix_cache_requests", (("scope", a_id),))] == 2
        assert m[("speclm_suffix_cache_requests", (("scope", b_id),))] == 1
        assert m[("speclm_suffix_cache_hits_total", (("scope", a_id),))] > 0
        assert 0 < m[("speclm_suffix_cache_hit_rate", (("scope", a_id),))] <= 1
        assert m[("speclm_suffix_cache_max_tokens", (("scope", a_id),))] == 100_000
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(url + "/admin/cache/clear", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(url + "/admin/cache/clear", headers={"Authorization": "Bearer key-a"})
        assert r.status_code == 200 and r.json()["scope"] == a_id and r.json()["suffix_cache"]["requests"] == 2
        m = scrape(url, Authorization="Bearer key-a")
        assert m[("speclm_suffix_cache_requests", (("scope", a_id),))] == 0
        assert m[("speclm_suffix_cache_requests", (("scope", b_id),))] == 1
        assert accepted(url, "key-a") == fresh
    shared = ServerConfig(model_id="toy", api_keys=("key-a", "key-b"), share_cache=True)
    with live(create_app(toy_llm(), shared)) as (url, _):
        assert accepted(url, "key-a") == fresh and accepted(url, "key-b") == warm
        assert scrape(url, Authorization="Bearer key-a")[("speclm_suffix_cache_requests", (("scope", "shared"),))] == 2


def test_each_api_key_reuses_only_its_own_prompt_kv_and_usage_says_how_much():
    """Prefix caching per tenant: key A's second prompt with the same start reuses A's
    KV (usage.prompt_tokens_details.cached_tokens, as OpenAI reports it), key B's does
    not (its time to first token would reveal A's prompt); the admin call clears it."""
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256), prefix_cache_tokens=1000)
    req = dict(model="toy", max_tokens=5, temperature=0, extra_body={"speculative": {"method": "ar"}})
    start = "abcdefghijklmnopqrst"

    def cached(url: str, key: str, prompt: str) -> int:
        usage = client(url, key).completions.create(prompt=prompt, **req).usage
        return usage.prompt_tokens_details.cached_tokens

    with live(create_app(llm, ServerConfig(model_id="toy", api_keys=("key-a", "key-b")))) as (url, _):
        assert cached(url, "key-a", start + "uvw") == 0
        assert cached(url, "key-b", start + "xyz") == 0  # A's KV is not B's
        assert cached(url, "key-a", start + "xyz") == len(start)
        m = scrape(url, Authorization="Bearer key-a")
        a = (("scope", tenant_id("key-a")),)
        assert m[("speclm_prefix_cache_hits_total", a)] == 1
        assert m[("speclm_prefix_cache_live_hits_total", a)] == 0  # one request at a time: no running KV to lend
        assert m[("speclm_prefix_cache_reused_tokens_total", a)] == len(start)
        assert m[("speclm_prefix_cache_entries", a)] == 2 and m[("speclm_prefix_cache_bytes", a)] > 0
        assert m[("speclm_prefix_cache_failed_total", a)] == 0
        r = httpx.post(url + "/admin/cache/clear", headers={"Authorization": "Bearer key-a"})
        assert r.status_code == 200 and r.json()["prefix_cache"]["entries"] == 2
        assert cached(url, "key-a", start + "xyz") == 0


def test_api_keys_come_from_a_list_and_blank_keys_are_refused(monkeypatch):
    assert split_keys(" a, b,,c ") == ["a", "b", "c"] and split_keys(None) == []
    assert ServerConfig(api_key="a", api_keys=("b", "a")).keys == ("a", "b")
    for bad in ("", " padded"):
        with pytest.raises(InvalidRequestError, match="API keys"):
            ServerConfig(api_keys=(bad,))


def test_queue_full_is_429_and_the_time_limit_cancels():
    llm = LLM(target=SlowToy(26, seed=4, n_ctx=1024))
    app = create_app(llm, ServerConfig(model_id="slow", max_concurrency=1, max_queue=1, request_timeout_s=1.5))
    body = {"prompt": "abc", "max_tokens": 900}
    with live(app) as (url, _), httpx.Client(timeout=30) as h:
        with h.stream("POST", url + C, json={**body, "stream": True}) as streaming:
            events = sse_events(streaming)
            next(events)
            queued: list[httpx.Response] = []
            waiter = threading.Thread(target=lambda: queued.append(httpx.post(url + C, json=body, timeout=30)))
            waiter.start()
            assert wait_until(lambda: app.state.speclm.engine.load == (1, 1))
            full = h.post(url + C, json=body)
            assert full.status_code == 429 and full.json()["error"]["code"] == "rate_limit_exceeded"
            assert full.headers["retry-after"] == "1"  # api_errors.RETRY_AFTER_S
            rest = list(events)
        assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "request_timeout"
        waiter.join(10)
        assert queued[0].status_code == 504 and queued[0].json()["error"]["type"] == "timeout_error"
        assert wait_until(lambda: llm.target.live_sequences == 0)


def test_non_stream_disconnect_cancels_the_request():
    llm = LLM(target=SlowToy(26, seed=4, n_ctx=1024))
    app = create_app(llm, ServerConfig(model_id="slow"))
    with live(app) as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + C, json={"prompt": "abc", "max_tokens": 900}, timeout=0.3)
        assert wait_until(lambda: app.state.speclm.engine.load == (0, 0), 1.0)  # 900 tokens take ~3 s
        assert llm.target.live_sequences == 0
        assert wait_until(lambda: scrape(url).get(  # the default method is auto, with or without a draft
            ("speclm_generations_total", (("finish_reason", "cancelled"), ("method", "auto")))) == 1)


def test_shutdown_ends_in_flight_streams_cleanly():
    llm = LLM(target=SlowToy(26, seed=4, n_ctx=1024))
    app = create_app(llm, ServerConfig(model_id="slow"))
    with live(app) as (url, server), httpx.Client(timeout=30) as h:
        t0 = time.monotonic()
        with h.stream("POST", url + C, json={"prompt": "abc", "max_tokens": 900, "stream": True}) as r:
            events = sse_events(r)
            next(events)
            server.should_exit = True
            rest = list(events)
        assert time.monotonic() - t0 < 2.5  # 900 tokens would take about 3 s
        assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "cancelled"
    assert llm.target.live_sequences == 0 and app.state.speclm.closing


def test_serve_parser_and_app(monkeypatch):
    parser = argparse.ArgumentParser(prog="speclm")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--target", "smollm2-135m", "--threads", "1", "--n-ctx", "256",
                              "--max-concurrency", "2"])
    assert (args.host, args.port, args.func) == ("127.0.0.1", 8000, cmd_serve)
    monkeypatch.setenv("SPECLM_API_KEY", "from-env")
    llm, app = build_app(args)
    try:
        state = app.state.speclm
        assert state.model_id == "smollm2-135m" and state.spec.method == DEFAULT_METHOD
        assert state.config.keys == ("from-env",) and state.config.max_concurrency == 2
        with live(app) as (url, _):
            assert httpx.get(url + "/v1/models").status_code == 401
            r = client(url, "from-env").completions.create(model="smollm2-135m", prompt="Hi", max_tokens=2)
            assert r.usage.completion_tokens <= 2
    finally:
        llm.close()


def test_the_load_test_tool_reports_every_request(smol):
    """speclm.server.loadtest, used for the load figures in notes, counts what it sends."""
    from speclm.server.loadtest import run_load

    llm, url, _ = smol
    res = run_load(url, clients=3, requests=6, max_tokens=8, api_key=None,
                   speculative={"method": "sd-ngram", "k": 3}, time_limit_s=120)
    summary = res.summary()
    assert summary["requests"] == 6 and summary["errors"] == 0, summary["error_samples"]
    assert summary["completion_tokens"] == 6 * 8 and len(res.ttft_s) == 6
    assert summary["latency_p50_s"] <= summary["latency_p99_s"]
    assert wait_until(lambda: llm.target.live_sequences == 0)
