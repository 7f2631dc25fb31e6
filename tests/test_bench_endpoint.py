"""`speclm bench --endpoint URL [--endpoint-b URL]`: the bench's prompts against live
OpenAI-compatible servers through the real `openai` client. Two speclm servers on
127.0.0.1 (an AR one and an `auto` one; exact toy models, then SmolLM2) must give
B-vs-A verdicts, latency distributions, throughput per concurrency, identical
greedy outputs and the servers' speculation counters. A fake server that records what
it is sent shows that no phase resends a prompt unflagged and that no row has more
requests in flight than it has prompts. Bad endpoints (nothing listening, a wrong
key, an HTML server, a server that never answers) must each end in one
`speclm: error:` line naming the fix, with what was measured kept."""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from speclm import LLM, SpecConfig
from speclm.backends.toy import ToyBackend
from speclm.bench.endpoint import metrics as endpoint_metrics
from speclm.bench.endpoint.client import EndpointError, base_url
from speclm.commands import main
from speclm.server import ServerConfig, create_app
from speclm.server.tenants import tenant_id
from speclm.commands.serve import add_serve_parser, build_app

from .test_server import live as live_server


@contextmanager
def live(app) -> Iterator[str]:
    """Serve an ASGI app on a free loopback port (tests/test_server.py's live); its URL."""
    with live_server(app) as (url, _):
        yield url


def toy_server(method: str, **config):
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256), max_sequences=4)
    return create_app(llm, ServerConfig(model_id="toy", default_spec=SpecConfig(method), **config))


def dataset(tmp_path: Path) -> Path:
    """Two raw prompts (→ /v1/completions) and two chat prompts (→ /v1/chat/completions)."""
    lines = [{"category": "code", "prompt": "abcabcabcabc", "chat": False},
             {"category": "code", "prompt": "abcdabcdab", "chat": False},
             {"category": "talk", "prompt": "hellohellohello"}, {"category": "talk", "prompt": "abab"}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def load(out: Path) -> tuple[list[dict], dict, dict, str]:
    requests = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return (requests, json.loads((out / "summary.json").read_text()),
            json.loads((out / "manifest.json").read_text()), (out / "report.md").read_text())


def generations(url: str) -> float:
    """Finished generations the speclm server at url has counted (its /metrics)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "speclm_generations_total")


# ---- two servers, compared ---------------------------------------------------------
def test_ar_and_auto_toy_servers_compared_per_category(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    data, out = dataset(tmp_path), tmp_path / "out"
    with live(toy_server("ar")) as a, live(toy_server("auto")) as b:
        assert main(["bench", "--endpoint", a, "--endpoint-b", b + "/v1", "--dataset", str(data),
                     "--max-new-tokens", "12", "--repeats", "2", "--concurrency", "1,2", "--no-wait-quiet",
                     "--out", str(out)]) == 0
        # bounded traffic: 1 warm-up + 4 prompts × 2 repeats + 4 prompts per N, on each server
        assert generations(a) == generations(b) == 1 + 8 + 4 * 2
    requests, summary, manifest, md = load(out)
    assert [(r["endpoint"], r["api"]) for r in requests[:2] + requests[-2:]] == [
        ("A", "completions"), ("B", "completions"), ("A", "chat"), ("B", "chat")]  # interleaved A, B per prompt
    assert len(requests) == 16 and all(r["tokens_from"] == "usage" and r["output_tokens"] == 12 for r in requests)
    assert all(r["ttft_ms"] > 0 and len(r["itl_ms"]) == r["deltas"] - 1 for r in requests)
    # at T=0 B (speculating) writes exactly what A (plain decoding) writes: the toy is batch-invariant
    assert summary["identity"] == {"compared": 8, "identical": 8, "divergences": []}
    assert [r["identity"] is None for r in requests] == [True, False] * 8
    rows = {(r["category"], r["method"]): r for r in summary["rows"]}
    assert set(rows) == {(c, m) for c in ("code", "talk", "all") for m in ("ar", "B")}
    b_code = rows[("code", "B")]
    assert b_code["identity"] == {"compared": 4, "identical": 4} and b_code["same_length"] == b_code["pairs"] == 4
    assert b_code["speedup"] == pytest.approx(b_code["wall_speedup"])  # equal lengths: the two ratios agree
    assert [v["category"] for v in summary["verdicts"]] == ["code", "talk", "all"]
    for v in summary["verdicts"]:  # the local bench's rule: p50 > 1, total > 1, most prompts faster
        r = rows[(v["category"], "B")]
        assert v["b_faster"] == (r["speedup_dist"]["p50"] > 1 and r["speedup"] > 1
                                 and 2 * r["prompts_faster"] > r["prompts"])
    assert all(v["evidence"].startswith(("yes: B ", "no: B ")) and "identical outputs" in v["evidence"]
               for v in summary["verdicts"])
    # who goes first alternates from row to row, so a drift of the machine falls on both servers alike
    assert [(c["endpoint"], c["concurrency"], c["requests"], c["position"]) for c in summary["concurrency"]] == [
        ("A", 1, 4, 1), ("B", 1, 4, 2), ("B", 2, 4, 1), ("A", 2, 4, 2)]
    by = {(c["endpoint"], c["concurrency"]): c["throughput_tok_s"] for c in summary["concurrency"]}
    by_ttft = {(c["endpoint"], c["concurrency"]): c["ttft_ms"]["p95"] for c in summary["concurrency"]}
    assert [(p["n"], p["first"]) for p in summary["b_over_a"]] == [("1", "A"), ("2", "B")]
    assert [p["ratio"] for p in summary["b_over_a"]] == pytest.approx([by["B", n] / by["A", n] for n in (1, 2)])
    assert all(p["ttft_p95_ms"] == {e: by_ttft[e, n] for e in "AB"} for p, n in zip(summary["b_over_a"], (1, 2)))
    assert "| N | T | B ÷ A tok/s | TTFT p95 A / B ms | first |" in md
    # 2 prompts a category cannot give 4 phases prompts of their own: every phase after the first replays
    assert [p["replay"] for p in summary["phases"]] == [False, True, True, True]
    assert [r["replay"] for r in requests] == [False] * 8 + [True] * 8
    assert all(c["replay"] for c in summary["concurrency"])
    assert all(c["throughput_tok_s"] > 0 and c["itl_ms"]["p99"] is not None for c in summary["concurrency"])
    assert {(r["endpoint"], r["category"]) for r in summary["latency"]} == {
        (e, c) for e in "AB" for c in ("code", "talk")}
    spec = {e["label"]: e["speculation"] for e in summary["endpoints"]}
    assert spec["A"]["source"] == spec["B"]["source"] == "speclm"
    assert spec["A"]["drafted"] == 0 and spec["B"]["drafted"] > 0 and 0 < spec["B"]["acceptance_rate"] <= 1
    assert spec["B"]["by_method"].keys() == {"auto"}
    assert manifest["endpoints"] == [{"label": "A", "url": a, "model": "toy", "tenants": 1},
                                     {"label": "B", "url": b, "model": "toy", "tenants": 1}]
    assert manifest["contamination"]["observed"]["waits"][0]["max_wait_s"] == 0
    for section in ("## B vs A per category", "## Output identity at T=0", "## Latency per endpoint",
                    "## Throughput under concurrency", "## Speculation metrics"):
        assert section in md
    console = capsys.readouterr().out
    assert "B vs A per category" in console and "is B faster for code (T=0)?" in console
    assert f"report: {out / 'report.md'}" in console


def serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speclm")
    add_serve_parser(p.add_subparsers(dest="command", required=True))
    return p.parse_args(["serve", *argv])


def test_smollm_ar_server_against_an_auto_server(tmp_path, capsys, monkeypatch):
    """Two real `speclm serve` apps (build_app, as the command builds them) on SmolLM2-135M:
    humaneval goes to /v1/completions, code-edit through the chat template; N = 1 and 4."""
    monkeypatch.setenv("COLUMNS", "200")
    llm_a, app_a = build_app(serve_args("--target", "smollm2-135m", "--threads", "1", "--n-ctx", "1024",
                                        "--method", "ar"))
    llm_b, app_b = build_app(serve_args("--target", "smollm2-135m", "--threads", "1", "--n-ctx", "1024",
                                        "--method", "auto"))
    out = tmp_path / "smol"
    try:
        with live(app_a) as a, live(app_b) as b:
            assert main(["bench", "--endpoint", a, "--endpoint-b", b, "--categories", "humaneval,code-edit",
                         "--prompts-per-category", "1", "--max-new-tokens", "16", "--concurrency", "1,4",
                         "--no-wait-quiet", "--out", str(out)]) == 0
    finally:
        llm_a.close()
        llm_b.close()
    requests, summary, _, _ = load(out)
    assert [(r["endpoint"], r["category"], r["api"]) for r in requests] == [
        ("A", "humaneval", "completions"), ("B", "humaneval", "completions"),
        ("A", "code-edit", "chat"), ("B", "code-edit", "chat")]
    assert all(r["model"] == "smollm2-135m" and r["prompt_tokens"] > 10 for r in requests)
    ident = summary["identity"]
    assert ident["compared"] == 2 and ident["identical"] + len(ident["divergences"]) == 2
    assert [(c["concurrency_requested"], c["concurrency"]) for c in summary["concurrency"]] == [
        (1, 1), (1, 1), (4, 2), (4, 2)]  # 2 prompts: N = 4 keeps 2 in flight
    assert {e["speculation"]["source"] for e in summary["endpoints"]} == {"speclm"}
    assert "is B faster for humaneval (T=0)?" in capsys.readouterr().out


# ---- bad endpoints -------------------------------------------------------------------
def failing(capsys, *argv: str) -> str:
    """Run the bench expecting a failure; the one error line it printed."""
    assert main(["bench", *argv, "--no-wait-quiet"]) == 1
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("speclm: error:")]
    assert len(errors) == 1
    return errors[0]


def partial(out: Path) -> dict:
    """The summary a failed run left, marked partial, its report saying so."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] and summary["error"]
    assert "**PARTIAL RESULTS**" in (out / "report.md").read_text() and (out / "manifest.json").exists()
    return summary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_a_one_line_error(tmp_path, capsys):
    url, out = f"http://127.0.0.1:{free_port()}", tmp_path / "o"
    line = failing(capsys, "--endpoint", url, "--dataset", str(dataset(tmp_path)), "--out", str(out))
    assert line.startswith(f"speclm: error: cannot reach endpoint A ({url}):")
    assert "check the URL and that the server is running" in line and f"(partial results in {out})" in line
    assert partial(out)["requests"] == 0


def test_a_wrong_key_is_named_with_the_flag_that_fixes_it(tmp_path, capsys):
    out = tmp_path / "o"
    with live(toy_server("ar")) as a, live(toy_server("auto", api_key="sekret")) as b:
        line = failing(capsys, "--endpoint", a, "--endpoint-b", b, "--endpoint-api-key-b", "wrong",
                       "--dataset", str(dataset(tmp_path)), "--out", str(out))
    assert line == (f"speclm: error: endpoint B ({b}) refused the API key (HTTP 401) on GET /v1/models: pass the "
                    f"server's key with --endpoint-api-key-b (or SPECLM_API_KEY) (partial results in {out})")
    partial(out)



def test_several_keys_are_several_tenants_one_per_category(tmp_path, monkeypatch):
    """A category's prompts go with one key, so its later prompts draft from its own earlier outputs,
    as one client's would; the server counts each tenant's requests apart."""
    import httpx
    out = tmp_path / "o"
    monkeypatch.delenv("SPECLM_API_KEY", raising=False)
    app = toy_server("sd-suffix", api_keys=("k-one", "k-two"), operator_key="k-op")
    with live(app) as url:
        assert main(["bench", "--endpoint", url, "--endpoint-api-key", "k-one,k-two", "--endpoint-operator-key",
                     "k-op", "--dataset", str(dataset(tmp_path)), "--max-new-tokens", "8", "--no-wait-quiet",
                     "--out", str(out)]) == 0
        metrics = httpx.get(url + "/metrics", headers={"Authorization": "Bearer k-op"}, timeout=10).text
    requests, _, manifest, _ = load(out)
    assert {(r["category"], r["tenant"]) for r in requests} == {("code", 0), ("talk", 1)}
    assert manifest["endpoints"][0]["tenants"] == 2
    for key in ("k-one", "k-two"):  # each tenant's suffix cache holds its own requests
        assert f'scope="{tenant_id(key)}"' in metrics

class HtmlHandler(http.server.BaseHTTPRequestHandler):
    """Not an API: an HTML page for everything."""

    def _reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _page(self):
        self._reply(b"<html><body><h1>Welcome</h1></body></html>", "text/html; charset=utf-8")

    do_GET = _page

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._page()

    def log_message(self, *args):
        pass


class ModelsThenSilence(HtmlHandler):
    """Lists a model, then holds every completion request without an answer."""

    release = threading.Event()

    def do_GET(self):
        self._reply(json.dumps({"object": "list", "data": [{"id": "slow", "object": "model"}]}).encode(),
                    "application/json")

    def do_POST(self):
        self.release.wait(30)


@contextmanager
def http_server(handler) -> Iterator[str]:
    ModelsThenSilence.release.clear()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        ModelsThenSilence.release.set()
        srv.shutdown()
        srv.server_close()


def test_a_server_that_is_not_openai_compatible(tmp_path, capsys):
    out = tmp_path / "o"
    with http_server(HtmlHandler) as url:
        line = failing(capsys, "--endpoint", url, "--dataset", str(dataset(tmp_path)), "--out", str(out))
    assert line.startswith(f"speclm: error: endpoint A ({url}) is not an OpenAI-compatible server: GET /v1/models "
                           "answered text/html; charset=utf-8, not JSON: check the URL")
    partial(out)


def test_a_server_that_never_answers_times_out_within_the_request_timeout(tmp_path, capsys):
    """A answers; B lists a model and then holds every request: its warm-up times out after 1 s."""
    out = tmp_path / "o"
    with live(toy_server("ar")) as a, http_server(ModelsThenSilence) as b:
        t0 = time.monotonic()
        line = failing(capsys, "--endpoint", a, "--endpoint-b", b, "--endpoint-timeout", "1",
                       "--dataset", str(dataset(tmp_path)), "--max-new-tokens", "6", "--out", str(out))
        assert time.monotonic() - t0 < 20  # bounded by the timeout, not by the server
    assert line == (f"speclm: error: endpoint B ({b}) did not answer POST /v1/completions within 1 s: raise "
                    f"--endpoint-timeout or check that the server is not stuck (partial results in {out})")
    summary = partial(out)
    kept = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert summary["requests"] == len(kept) == 0  # B's warm-up failed: nothing was timed yet
    assert [e["label"] for e in summary["endpoints"]] == ["A", "B"]


def test_a_timeout_mid_run_keeps_the_requests_already_measured(tmp_path, capsys, monkeypatch):
    """The warm-up passes, the third timed request hangs: the first two stay on disk and in the summary."""
    from speclm.bench.endpoint import client
    real, calls = client.stream_one, []

    def flaky(ep, prompt, *a, **kw):
        calls.append(ep.label)
        if len(calls) == 5:  # warm-ups A, B; timed A, B on prompt 0; then A on prompt 1
            raise client.explain(TimeoutError(), ep.label, ep.url, "POST /v1/completions", ep.timeout)
        return real(ep, prompt, *a, **kw)
    monkeypatch.setattr(client, "stream_one", flaky)
    out = tmp_path / "o"
    with live(toy_server("ar")) as a, live(toy_server("auto")) as b:
        line = failing(capsys, "--endpoint", a, "--endpoint-b", b, "--dataset", str(dataset(tmp_path)),
                       "--max-new-tokens", "6", "--out", str(out))
    assert f"endpoint A ({a}) did not answer POST /v1/completions within 120 s" in line
    summary = partial(out)
    kept = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert [(r["endpoint"], r["prompt_index"]) for r in kept] == [("A", 0), ("B", 0)] and summary["requests"] == 2
    assert summary["identity"]["compared"] == 1 and [r["method"] for r in summary["rows"]] == ["ar", "B"]


def test_flags_that_make_no_sense_with_an_endpoint_fail_before_any_traffic(capsys):
    assert main(["bench", "--endpoint-b", "http://127.0.0.1:1"]) == 1
    assert "--endpoint-b needs --endpoint URL" in capsys.readouterr().err
    assert main(["bench", "--endpoint", "http://127.0.0.1:1", "--methods", "sd-ngram", "--k", "4"]) == 1
    assert "--methods, --k do not apply with --endpoint" in capsys.readouterr().err
    assert main(["bench", "--endpoint", "127.0.0.1:8000"]) == 1
    assert "is not an http(s) URL: give the server's base URL, e.g. http://127.0.0.1:8000" in capsys.readouterr().err


# ---- fresh prompts per phase, and N never above the requests a row has ----------------------------
class FakeOpenAI(HtmlHandler):
    """An OpenAI-compatible server that remembers every prompt it is sent and the most
    requests it had in flight at once, and streams "abc" after `hold` seconds (so
    requests sent together overlap). `fake_openai()` gives each test a class of its own."""

    sent: list[str]
    now: int
    peak: int
    lock: threading.Lock
    hold = 0.25

    def do_GET(self):
        if self.path.rstrip("/") != "/v1/models":
            self.send_error(404)
            return
        self._reply(json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode(),
                    "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        chat = self.path.endswith("/chat/completions")
        cls = type(self)
        with cls.lock:
            cls.sent.append(body["messages"][0]["content"] if chat else body["prompt"])
            cls.now += 1
            cls.peak = max(cls.peak, cls.now)
        try:
            time.sleep(self.hold)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            kind = "chat.completion.chunk" if chat else "text_completion"
            for i, piece in enumerate("abc"):
                choice = {"index": 0, "finish_reason": "length" if i == 2 else None,
                          **({"delta": {"content": piece}} if chat else {"text": piece, "logprobs": None})}
                self.wfile.write(b"data: " + json.dumps({"id": "x", "object": kind, "created": 0, "model": "fake",
                                                         "choices": [choice]}).encode() + b"\n\n")
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            self.wfile.write(b"data: " + json.dumps({"id": "x", "object": kind, "created": 0, "model": "fake",
                                                     "choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        finally:
            with cls.lock:
                cls.now -= 1


def fake_openai() -> type[FakeOpenAI]:
    return type("Fake", (FakeOpenAI,), {"sent": [], "now": 0, "peak": 0, "lock": threading.Lock()})


def prompt_file(tmp_path: Path, per_category: dict[str, int]) -> Path:
    lines = [{"category": c, "prompt": f"{c} prompt {i}", "chat": c != "raw"} for c, n in per_category.items()
             for i in range(n)]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_six_prompts_at_concurrency_16_are_6_in_flight_and_every_resend_is_flagged_a_replay(tmp_path, capsys,
                                                                                           monkeypatch):
    """Two prompts a category cannot give 3 phases prompts of their own: every phase sends all
    6, the two concurrency rows are flagged replays, and the 16 row keeps 6 in flight."""
    monkeypatch.setenv("COLUMNS", "200")
    fake, out = fake_openai(), tmp_path / "o"
    with http_server(fake) as url:
        assert main(["bench", "--endpoint", url, "--dataset", str(prompt_file(tmp_path, {"raw": 2, "b": 2, "c": 2})),
                     "--max-new-tokens", "3", "--concurrency", "1,16", "--no-wait-quiet", "--out", str(out)]) == 0
    requests, summary, _, md = load(out)
    prompts = [f"{c} prompt {i}" for c in ("raw", "b", "c") for i in range(2)]
    assert fake.sent[0] == prompts[0][::-1] and fake.sent[1:13] == prompts * 2  # the warm-up, latency, N=1
    assert sorted(fake.sent[13:]) == sorted(prompts)  # N=16, in whatever order the 6 arrived
    assert fake.peak == 6
    rows = summary["concurrency"]
    assert [(c["concurrency_requested"], c["concurrency"], c["requests"]) for c in rows] == [(1, 1, 6), (16, 6, 6)]
    assert [c["in_flight_peak"] for c in rows] == [1, 6] and all(c["replay"] for c in rows)
    assert [p["replay"] for p in summary["phases"]] == [False, True, True]
    assert not any(r["replay"] for r in requests) and {r["phase"] for r in requests} == {"latency T=0 3 tokens repeat 1"}
    replay, capped = summary["warnings"]
    assert replay.startswith("2 of 3 phases resend prompts their server was sent earlier in this run")
    assert capped == "--concurrency 16 ran as N = 6: a row has only 6 prompts, so no more requests were in flight"
    assert "| A | 6 (16 asked) | 6 | REPLAY |" in md and "## Prompts per phase" in md
    console = capsys.readouterr().out
    assert "A N=6 (16 asked) REPLAY:" in console and "A N=1 REPLAY:" in console


def test_a_server_is_never_sent_a_prompt_twice_when_every_category_has_one_per_phase(tmp_path):
    """6 prompts a category, 4 phases (2 repeats, N = 1 and 4): each phase takes a contiguous
    run of every category, so each server gets each prompt once; A and B the same ones."""
    a, b, out = fake_openai(), fake_openai(), tmp_path / "o"
    data = prompt_file(tmp_path, {"raw": 6, "chat": 6})
    with http_server(a) as url_a, http_server(b) as url_b:
        assert main(["bench", "--endpoint", url_a, "--endpoint-b", url_b, "--dataset", str(data), "--repeats", "2",
                     "--max-new-tokens", "3", "--concurrency", "1,4", "--no-wait-quiet", "--out", str(out)]) == 0
    requests, summary, _, md = load(out)
    prompts = [f"{c} prompt {i}" for c in ("raw", "chat") for i in range(6)]
    for fake in (a, b):
        assert fake.sent[0] == prompts[0][::-1] and sorted(fake.sent[1:]) == sorted(prompts)
    assert [len(p["prompts"]) for p in summary["phases"]] == [2, 4, 2, 4] and not any(
        p["replay"] for p in summary["phases"])
    assert [(r["repeat"], r["category"], r["prompt_index"]) for r in requests if r["endpoint"] == "A"] == [
        (0, "raw", 0), (0, "chat", 0), (1, "raw", 1), (1, "raw", 2), (1, "chat", 1), (1, "chat", 2)]
    rows = summary["concurrency"]
    assert [(c["endpoint"], c["concurrency"], c["requests"], c["replay"]) for c in rows] == [
        ("A", 1, 2, False), ("B", 1, 2, False), ("B", 4, 4, False), ("A", 4, 4, False)]
    assert [c["in_flight_peak"] for c in rows] == [1, 1, 4, 4] and a.peak == b.peak == 4
    assert summary["warnings"] == [] and "| REPLAY |" not in md and "| fresh |" in md


# ---- the pieces ----------------------------------------------------------------------------
def test_base_url_accepts_the_root_or_the_v1_url():
    assert base_url("http://h:8000") == base_url("http://h:8000/") == base_url("http://h:8000/v1/") == "http://h:8000"
    with pytest.raises(EndpointError, match="not an http"):
        base_url("ftp://h")


SPECLM_BEFORE = """speclm_spec_drafted_tokens_total{method="auto"} 10
speclm_spec_accepted_tokens_total{method="auto"} 5
speclm_spec_rounds_total{method="auto"} 8
speclm_spec_position_proposed_total{method="auto",position="1"} 4
speclm_spec_position_accepted_total{method="auto",position="1"} 3
"""
SPECLM_AFTER = """speclm_spec_drafted_tokens_total{method="auto"} 40
speclm_spec_accepted_tokens_total{method="auto"} 29
speclm_spec_rounds_total{method="auto"} 20
speclm_spec_drafted_tokens_total{method="ar"} 0
speclm_spec_rounds_total{method="ar"} 7
speclm_spec_accepted_tokens_total{method="ar"} 0
speclm_spec_position_proposed_total{method="auto",position="1"} 14
speclm_spec_position_accepted_total{method="auto",position="1"} 11
speclm_spec_position_proposed_total{method="auto",position="2"} 10
speclm_spec_position_accepted_total{method="auto",position="2"} 5
"""
VLLM_AFTER = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 3.0
"""


def scraped(text: str) -> dict:
    return {"ok": True, "samples": endpoint_metrics.parse(text)}


def test_speculation_counters_by_speclm_and_vllm_names():
    s = endpoint_metrics.speculation(scraped(SPECLM_BEFORE), scraped(SPECLM_AFTER))
    assert s["source"] == "speclm" and (s["drafted"], s["accepted"], s["rounds"]) == (30, 24, 19)
    assert s["acceptance_rate"] == pytest.approx(24 / 30)
    assert s["mean_acceptance_length"] == pytest.approx((24 + 19) / 19)
    assert s["per_position_acceptance"] == pytest.approx([8 / 10, 5 / 10])
    assert s["by_method"] == {"auto": {"drafted": 30, "accepted": 24, "rounds": 12}, "ar": {
        "drafted": 0, "accepted": 0, "rounds": 7}}
    v = endpoint_metrics.speculation(scraped(""), scraped(VLLM_AFTER))  # a fresh server: no samples before
    assert v["source"] == "vllm" and (v["drafts"], v["drafted"], v["accepted"]) == (10, 30, 18)
    assert v["acceptance_rate"] == pytest.approx(0.6) and v["mean_acceptance_length"] == pytest.approx(2.8)
    assert v["per_position_acceptance"] == pytest.approx([0.9, 0.6, 0.3])
    none = endpoint_metrics.speculation(scraped("other_metric_total 3\n"), scraped("other_metric_total 4\n"))
    assert none["source"] is None and "no speculative-decoding metrics" in none["why"]
    assert endpoint_metrics.speculation({"ok": False, "why": "GET /metrics answered HTTP 404"}, {"ok": False,
                                        "why": "GET /metrics answered HTTP 404"}) == {
        "source": None, "why": "GET /metrics answered HTTP 404"}
    with pytest.raises(ValueError):
        endpoint_metrics.parse("<html>not metrics</html>")


def test_metrics_are_read_with_the_operator_key_and_a_tenant_key_is_told_what_to_pass():
    llm = LLM(target=ToyBackend(26, seed=4, n_ctx=256))
    app = create_app(llm, ServerConfig(model_id="toy", api_keys=("tenant",), operator_key="operator"))
    with live_server(app) as (url, _):
        refused = endpoint_metrics.scrape(url, "tenant", timeout=10)
        assert not refused["ok"] and "403" in refused["why"] and "--endpoint-operator-key" in refused["why"]
        assert endpoint_metrics.scrape(url, "operator", timeout=10)["ok"]
    llm.close()
