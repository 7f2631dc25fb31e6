"""Slow and greedy clients against the HTTP server that `speclm serve` configures
(speclm/server/connections.py): raw sockets on a live uvicorn, with the bounds
made small through the serve flags. Other loopback addresses (127.0.0.2, ...)
stand for other clients."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from speclm import LLM
from speclm.commands.flags import build
from speclm.commands.serve import uvicorn_config
from speclm.server import ServerConfig, create_app

from .test_server import C, SlowToy, client, live, toy_llm
from .test_server_faults import parse_serve

HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
HALF_SENT = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{\"prompt\": \"")  # a head, then a body that stops


@contextmanager
def serving(*flags: str, llm: LLM | None = None) -> Iterator[tuple[str, int]]:
    """A toy app under the server and uvicorn configs `speclm serve FLAGS` makes; yields (url, port)."""
    args = parse_serve("--log-level", "error", *flags)
    app = create_app(llm or toy_llm(), build(args, ServerConfig, model_id="toy"))
    with live(app, uvicorn_config(app, args)) as (url, _):
        yield url, int(url.rpartition(":")[2])


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def until_closed(s: socket.socket, limit: float = 10.0) -> tuple[float, bytes]:
    """(seconds until the server closed `s`, what it sent before)."""
    t0, reply = time.monotonic(), b""
    s.settimeout(limit)
    try:
        while chunk := s.recv(65536):
            reply += chunk
    except ConnectionResetError:
        pass
    return time.monotonic() - t0, reply


def trickle(s: socket.socket, data: bytes, every: float, limit: float = 10.0) -> float:
    """Send `data` a byte every `every` s until the server answers or closes `s`; the seconds that took."""
    t0 = time.monotonic()
    s.settimeout(every)
    for byte in data:
        try:
            s.send(bytes([byte]))
            s.recv(1, socket.MSG_PEEK)  # waits `every` s: returns once the server answered or closed
            break
        except TimeoutError:
            if time.monotonic() - t0 > limit:
                break
        except (BrokenPipeError, ConnectionResetError):
            break
    return time.monotonic() - t0


def response(s: socket.socket) -> bytes:
    """One whole HTTP response from `s` (its body sized by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    size = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < size:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_silent_or_trickling_client_is_cut_off_at_the_header_timeout():
    """Without a header timeout (uvicorn's own), either holds its connection forever."""
    with serving("--header-timeout", "0.5") as (url, port):
        with connect(port) as silent:
            seconds, reply = until_closed(silent)
        assert 0.4 < seconds < 2.0 and reply == b""  # a silent client gets no answer, as at keep-alive's end
        with connect(port) as slow:
            assert 0.4 < trickle(slow, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200, 0.05) < 2.0
            _, reply = until_closed(slow)
        assert reply.startswith(b"HTTP/1.1 408") and b"--header-timeout" in reply
        with connect(port) as kept:  # a kept-alive connection's next head is bounded the same way
            kept.sendall(HEAD)
            assert response(kept).startswith(b"HTTP/1.1 200")
            assert 0.4 < trickle(kept, HEAD.replace(b"\r\n\r\n", b"\r\nX-Pad: " + b"a" * 200), 0.05) < 2.0


def test_the_header_timeout_bounds_only_the_head():
    """A head sent in pieces within the bound is served, and so is a request that
    takes longer than the bound once its head arrived."""
    llm = LLM(target=SlowToy(26, seed=4, n_ctx=1024))
    with serving("--header-timeout", "0.5", llm=llm) as (url, port):
        with connect(port) as s:
            s.sendall(HEAD[:10])
            time.sleep(0.2)
            s.sendall(HEAD[10:])
            assert response(s).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        r = client(url).completions.create(model="toy", prompt="abc", max_tokens=300, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 300 and time.monotonic() - t0 > 0.5


def test_two_hundred_silent_clients_from_one_address_leave_the_server_to_others():
    """One address gets --max-connections-per-client connections; the rest are
    answered 429 and closed at once, so requests from elsewhere, /health included,
    go through. Without the cap the 200 would fill the 100-connection budget."""
    with serving("--max-connections-per-client", "16", "--max-connections", "100") as (url, port):
        flood = [connect(port, "127.0.0.2") for _ in range(200)]
        try:
            refused = 0
            for s in flood[16:]:
                seconds, reply = until_closed(s, 5.0)
                refused += reply.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in reply.lower()
            assert refused == 184
            assert httpx.get(url + "/health").status_code == 200
            assert httpx.get(url + "/v1/models").status_code == 200
            r = client(url).completions.create(model="toy", prompt="abc", max_tokens=3)
            assert r.usage.completion_tokens == 3
            with connect(port, "127.0.0.2") as again:  # the address is still at its cap
                assert until_closed(again, 5.0)[1].startswith(b"HTTP/1.1 429")
        finally:
            for s in flood:
                s.close()
        with connect(port, "127.0.0.2") as later:  # its connections closed: it is served again
            later.sendall(HEAD)
            assert response(later).startswith(b"HTTP/1.1 200")


def test_health_answers_while_the_connection_budget_is_full():
    """Beyond --max-connections every route but /health is a 503 with an OpenAI
    error and Retry-After (uvicorn's own cap answered /health 503 too)."""
    with serving("--max-connections", "4", "--max-connections-per-client", "2") as (url, port):
        idle = [connect(port, f"127.0.0.{2 + i // 2}") for i in range(4)]
        try:
            time.sleep(0.2)
            full = httpx.get(url + "/v1/models")
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "overloaded"
            assert httpx.get(url + "/health").status_code == 200
        finally:
            for s in idle:
                s.close()
        assert httpx.get(url + "/v1/models").status_code == 200


def test_half_sent_bodies_hold_no_queue_place():
    """A request takes a queue place once its body has arrived and parsed (issue 43): with
    --max-queue 1, a hundred requests whose bodies stop after `{"prompt": "` hold connections
    only, so a complete request is served at once, and each of them is still cut at the body
    timeout. Four addresses of 25 and a budget of 128 admit all hundred: the defaults (32 a
    client, 1 + 1 + 32 connections) would refuse most of them before their heads were read."""
    with serving("--max-concurrency", "1", "--max-queue", "1", "--body-timeout", "1",
                 "--max-connections", "128") as (url, port):
        half = [connect(port, f"127.0.0.{2 + i // 25}") for i in range(100)]
        try:
            for s in half:
                s.sendall(HALF_SENT)
            sent = time.monotonic()
            time.sleep(0.2)  # every head is in: each request waits for its body
            assert httpx.get(url + "/health").json()["ready"]
            r = client(url).completions.create(model="toy", prompt="abc", max_tokens=3)
            assert r.usage.completion_tokens == 3 and time.monotonic() - sent < 0.9  # before any body timeout
            for s in half:
                _, reply = until_closed(s, 5.0)
                assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
            assert 0.9 < time.monotonic() - sent < 4.0
        finally:
            for s in half:
                s.close()


@pytest.mark.parametrize("flags", [("--header-timeout", "0"), ("--max-connections-per-client", "-1")])
def test_bad_connection_flags_are_refused(flags):
    from speclm.commands.flags import build
    from speclm.errors import InvalidRequestError
    from speclm.server.config import ListenConfig
    with pytest.raises(InvalidRequestError):
        build(parse_serve(*flags), ListenConfig)
