"""speclm/loadgen.py, the load generator the endpoint bench, the server's load test and
the soak send through: one timed request against a live toy server (streamed and whole,
text and chat), N closed-loop clients over a run of requests (kept or raised failures,
never more in flight than clients or items), and an answer that is no event stream."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from speclm import LLM, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.loadgen import NotOpenAICompatible, Request, openai_client, run_clients, timed_request
from speclm.server import ServerConfig, create_app

from .test_server import live


@pytest.fixture(scope="module")
def toy_url():
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256), max_sequences=4)
    with live(create_app(llm, ServerConfig(model_id="toy", default_spec=SpecConfig("ar")))) as (url, _):
        yield url
    llm.close()


@pytest.mark.parametrize("chat", [False, True])
def test_a_streamed_request_is_timed_per_delta_and_agrees_with_the_whole_answer(toy_url, chat):
    client = openai_client(toy_url, None, 30)
    streamed = timed_request(client, Request("abcabcabc", chat=chat, max_tokens=10), model=None, timeout=30)
    assert streamed.completion_tokens == streamed.output_tokens == 10 and streamed.prompt_tokens > 0
    assert streamed.t0 < streamed.deltas[0] <= streamed.deltas[-1] <= streamed.end
    assert 0 < streamed.ttft_s <= streamed.latency_s and len(streamed.itl_s) == len(streamed.deltas) - 1
    assert streamed.finish_reason == "length" and "text/event-stream" in streamed.headers["content-type"]
    whole = timed_request(client, Request("abcabcabc", chat=chat, max_tokens=10, stream=False), model="toy",
                          timeout=30)
    assert whole.text == streamed.text and whole.completion_tokens == 10 and len(whole.deltas) == 1  # T = 0


def test_clients_keep_failures_or_stop_at_the_first(toy_url):
    client = openai_client(toy_url, None, 30)
    good, bad = Request("abab", max_tokens=4), Request("abab", max_tokens=4, extra={"speculative": {"nope": 1}})
    load = run_clients(2, [good, bad, good, good], lambda r: timed_request(client, r, model=None, timeout=30),
                       keep_errors=True)
    assert load.requests == 4 and len(load.results) == 3 and load.wall_s > 0
    assert [type(e) for e in load.errors] == [openai.BadRequestError]
    sent: list[Request] = []

    def send(r: Request):
        sent.append(r)
        return timed_request(client, r, model=None, timeout=30)
    with pytest.raises(openai.BadRequestError):
        run_clients(1, [good, bad, good, good], send)
    assert sent == [good, bad]  # one client: nothing is taken after the failure


def test_never_more_in_flight_than_clients_or_items_and_results_in_item_order():
    lock, now, peak = threading.Lock(), [0], [0]
    four = threading.Barrier(4, timeout=10)  # the first four items wait for each other: four clients run at once

    def send(i: int) -> int:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        if i < 4:
            four.wait()
        time.sleep(0.01 * (i % 3))  # answers come back out of order
        with lock:
            now[0] -= 1
        return i
    assert run_clients(4, range(12), send).results == list(range(12)) and peak[0] == 4
    peak[0] = 0
    assert run_clients(16, range(10, 13), send).results == [10, 11, 12] and peak[0] <= 3
    assert run_clients(4, range(12), send, until=time.perf_counter()).requests == 0  # past its deadline
    stop = threading.Event()
    stop.set()
    assert run_clients(2, iter(range(10**9)), send, stop=stop).requests == 0


def test_an_answer_that_is_no_event_stream_is_named():
    page = httpx.MockTransport(lambda req: httpx.Response(200, html="<html>hi</html>"))
    client = openai.OpenAI(base_url="http://fake/v1", api_key="k", http_client=httpx.Client(transport=page))
    with pytest.raises(NotOpenAICompatible, match="with stream=true answered text/html.*not an event stream"):
        timed_request(client, Request("abc"), model=None, timeout=5)
