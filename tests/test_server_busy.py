"""Busy means a queue or 429, never 500 (issue 34, finding 2): a server whose
default is plain decoding measures the costs of every method a request may ask
for at start-up, so the first `auto` request, arriving while every KV sequence
decodes, waits for a slot like any other request."""

from __future__ import annotations

import json

import httpx
import pytest

from speclm import LLM, SamplingParams, SpecConfig
from speclm.errors import BusyError
from speclm.server import ServerConfig, create_app
from speclm.server.api_errors import api_error

from .test_server import C, SlowToy, live, sse_events


def slow_pair() -> LLM:
    """Toys that hold two KV sequences each, like `LLM(max_sequences=2)` on llama.cpp, and whose
    forwards take 20 ms: two 60-token streams outlast the start of the test's request."""
    return LLM(target=SlowToy(26, seed=4, n_ctx=512, max_sequences=2, delay_s=0.02),
               draft=SlowToy(26, seed=8, order=1, n_ctx=512, max_sequences=2, delay_s=0.02))


def test_the_first_auto_request_while_every_sequence_decodes_is_served():
    llm = slow_pair()
    app = create_app(llm, ServerConfig(model_id="toy", max_concurrency=2, default_spec=SpecConfig("ar")))
    long = {"prompt": "abcabc", "max_tokens": 60, "ignore_eos": True, "temperature": 0, "stream": True}
    with live(app) as (url, _), httpx.Client(timeout=60) as h:
        with h.stream("POST", url + C, json=long) as s1, \
                h.stream("POST", url + C, json={**long, "prompt": "xyz"}) as s2:
            streams = [sse_events(s1), sse_events(s2)]  # held: a dropped one would disconnect its request
            for events in streams:
                next(events)
            assert llm.target.live_sequences == 2  # every KV sequence decodes
            auto = h.post(url + C, json={"prompt": "abab", "max_tokens": 8, "speculative": {"method": "auto"}})
            assert auto.status_code == 200, auto.text
            assert auto.json()["usage"]["speculative"]["method"] == "auto"
    llm.close()


def test_timing_costs_with_every_sequence_held_is_busy_and_answers_429():
    """The library path (no server start-up to measure first): a BusyError that
    names the fix, which the server answers with 429."""
    llm = slow_pair()
    held = [llm.target.new_sequence() for _ in range(2)]
    with pytest.raises(BusyError, match="all 2 KV sequences .* in use.*retry when a request has finished"):
        llm.generate("abab", SamplingParams(max_new_tokens=4), SpecConfig("auto"))
    for seq in held:
        llm.target.free(seq)
    assert llm.generate("abab", SamplingParams(max_new_tokens=4), SpecConfig("auto")).token_ids  # then it runs
    err = api_error(BusyError("all 2 KV sequences are in use"))
    assert err.status == 429
    llm.close()
