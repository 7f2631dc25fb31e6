"""`speclm bench --endpoint URL [--endpoint-b URL]`: the bench's prompts against one or
two running OpenAI-compatible servers, through the real `openai` client, streaming.

Which API: a prompt the local bench runs through the chat template (every
category but humaneval) goes to /v1/chat/completions as one user message, so
the server applies its own chat template to it, as the local bench applies the
model's; a raw prompt (humaneval, or a dataset line with "chat": false) goes
to /v1/completions as text. Every request streams (stream_options.include_usage
for the token counts) with the bench's T, max_tokens and seed; --ignore-eos
sends the `ignore_eos` extension (speclm and vLLM accept it).

What a request measures (client side, so network and queueing are included):
- TTFT: request sent → first non-empty content delta;
- per-token latency (TPOT): (last delta − first delta) / (completion tokens − 1);
- ITL: the gaps between successive content deltas. A server that streams a
  speculative round's tokens in one delta shows one gap for them.
Order: per prompt, A then B (interleaved, as the local bench runs AR then each
method). Traffic goes only to the URLs given: GET /v1/models once (the model id
and a compatibility check), GET /metrics before and after, and the bounded
requests (prompts × repeats × T × max_new_tokens, plus one pass per --concurrency
N, and one 8-token warm-up request per server), each cut off after
--request-timeout seconds. No retries.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ..errors import SpeclmError
from .analysis.distributions import distribution
from .setup.workloads import Prompt


class EndpointError(SpeclmError):
    """An endpoint could not be benchmarked: unreachable, refused, not OpenAI-compatible, too slow."""


def _one_line(text: object, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _openai():
    try:
        import openai
    except ImportError:
        raise EndpointError("--endpoint needs the openai package: pip install 'openai>=1.30'") from None
    return openai


def base_url(url: str) -> str:
    """The server's root URL ('http://host:8000') from what was given (a trailing /v1 is dropped)."""
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise EndpointError(f"{url!r} is not an http(s) URL: give the server's base URL, e.g. http://127.0.0.1:8000")
    root = url.strip().rstrip("/")
    return root[:-3].rstrip("/") if root.endswith("/v1") else root


@dataclass
class Endpoint:
    """One server: label ('A' or 'B'), root URL, the model id it is asked for, its client."""

    label: str
    url: str
    model: str
    api_key: str | None
    timeout: float
    client: Any = field(repr=False, default=None)


def explain(exc: BaseException, ep_label: str, url: str, what: str, timeout: float) -> EndpointError:
    """One line naming the endpoint, what failed and the fix."""
    openai, who = _openai(), f"endpoint {ep_label} ({url})"
    import httpx
    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException, TimeoutError)):
        return EndpointError(f"{who} did not answer {what} within {timeout:g} s: raise --request-timeout "
                             "or check that the server is not stuck")
    if isinstance(exc, openai.APIConnectionError) or isinstance(exc, httpx.TransportError):
        cause = exc.__cause__ or exc.__context__ or exc
        return EndpointError(f"cannot reach {who}: {_one_line(cause)}: check the URL and that the server is running")
    key_flag = "--api-key-b" if ep_label == "B" else "--api-key"
    if isinstance(exc, openai.AuthenticationError):
        return EndpointError(f"{who} refused the API key (HTTP 401) on {what}: pass the server's key with {key_flag} "
                             "(or SPECLM_API_KEY)")
    if isinstance(exc, openai.PermissionDeniedError):
        return EndpointError(f"{who} forbids {what} (HTTP 403): use a key allowed to call it ({key_flag})")
    if isinstance(exc, openai.NotFoundError):
        return EndpointError(f"{who} is not an OpenAI-compatible server: {what} answered HTTP 404: give the "
                             "server's base URL (e.g. http://127.0.0.1:8000) and, if needed, --endpoint-model")
    if isinstance(exc, openai.APIStatusError):
        return EndpointError(f"{who} answered {what} with HTTP {exc.status_code}: {_one_line(exc.message)}")
    if isinstance(exc, openai.APIError):
        return EndpointError(f"{who} reported an error on {what}: {_one_line(exc.message)}")
    return EndpointError(f"{who}: {what} failed: {type(exc).__name__}: {_one_line(exc)}")


def connect(label: str, url: str, api_key: str | None, model: str | None, timeout: float) -> Endpoint:
    """Check the server (GET /v1/models: reachable, key accepted, JSON model list) and pick the model."""
    openai, root = _openai(), base_url(url)
    client = openai.OpenAI(base_url=root + "/v1", api_key=api_key or "none", max_retries=0, timeout=timeout)
    try:
        raw = client.models.with_raw_response.list()
        http = raw.http_response
        body = json.loads(http.text)
    except json.JSONDecodeError:
        ctype = http.headers.get("content-type", "no content type")
        raise EndpointError(f"endpoint {label} ({root}) is not an OpenAI-compatible server: GET /v1/models "
                            f"answered {_one_line(ctype, 60)}, not JSON: check the URL (the server's base, "
                            "e.g. http://127.0.0.1:8000)") from None
    except Exception as exc:
        raise explain(exc, label, root, "GET /v1/models", timeout) from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise EndpointError(f"endpoint {label} ({root}) is not an OpenAI-compatible server: GET /v1/models has no "
                            "\"data\" list: check the URL")
    ids = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if model is None and not ids:
        flag = "--endpoint-model-b" if label == "B" else "--endpoint-model"
        raise EndpointError(f"endpoint {label} ({root}) lists no model: name the one to use with {flag}")
    return Endpoint(label, root, model or ids[0], api_key, timeout, client)


def _delta_text(chunk: Any, chat: bool) -> tuple[str, str | None]:
    if not chunk.choices:
        return "", None
    c = chunk.choices[0]
    text = (c.delta.content if c.delta is not None else None) if chat else c.text
    return text or "", c.finish_reason


def stream_one(ep: Endpoint, prompt: Prompt, temperature: float, max_tokens: int, seed: int,
               ignore_eos: bool = False) -> dict:
    """One streamed request; its record (times in ms). Raises EndpointError on any failure."""
    if not isinstance(prompt.prompt, str):
        raise EndpointError(f"{prompt.category} prompt {prompt.index} is token ids: --endpoint needs text prompts")
    kw: dict = dict(model=ep.model, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=True,
                    stream_options={"include_usage": True}, timeout=ep.timeout)
    if ignore_eos:
        kw["extra_body"] = {"ignore_eos": True}
    route = "POST /v1/chat/completions" if prompt.chat else "POST /v1/completions"
    times: list[float] = []
    parts: list[str] = []
    usage, finish = None, None
    t0 = time.perf_counter()
    try:
        api = ep.client.chat.completions if prompt.chat else ep.client.completions
        msg = {"messages": [{"role": "user", "content": prompt.prompt}]} if prompt.chat else {"prompt": prompt.prompt}
        with api.with_streaming_response.create(**msg, **kw) as resp:
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                raise EndpointError(f"endpoint {ep.label} ({ep.url}) is not an OpenAI-compatible server: {route} with "
                                    f"stream=true answered {_one_line(ctype or 'no content type', 60)}, not an "
                                    "event stream: check the URL")
            for chunk in resp.parse():
                now = time.perf_counter()
                if now - t0 > ep.timeout:
                    raise TimeoutError
                usage = chunk.usage or usage
                text, fin = _delta_text(chunk, prompt.chat)
                finish = fin or finish
                if text:
                    times.append(now)
                    parts.append(text)
    except Exception as exc:
        raise explain(exc, ep.label, ep.url, route, ep.timeout) from None
    end = time.perf_counter()
    if not times and finish is None and usage is None:
        raise EndpointError(f"endpoint {ep.label} ({ep.url}) is not an OpenAI-compatible server: {route} streamed "
                            "no completion events: check the URL")
    n_out = usage.completion_tokens if usage is not None else len(times)
    wall = (end - t0) * 1000
    ttft = (times[0] - t0) * 1000 if times else None
    return {"endpoint": ep.label, "url": ep.url, "model": ep.model, "api": "chat" if prompt.chat else "completions",
            "category": prompt.category, "prompt_index": prompt.index, "chat": prompt.chat,
            "temperature": temperature, "max_new_tokens": max_tokens, "seed": seed,
            "prompt_tokens": usage.prompt_tokens if usage is not None else None, "output_tokens": n_out,
            "tokens_from": "usage" if usage is not None else "deltas", "finish_reason": finish, "wall_ms": wall,
            "ttft_ms": ttft, "tpot_ms": (times[-1] - times[0]) * 1000 / (n_out - 1) if len(times) > 1 and n_out > 1
            else None, "itl_ms": [(b - a) * 1000 for a, b in zip(times, times[1:])], "deltas": len(times),
            "tokens_per_s": 1000.0 * n_out / wall if wall > 0 else 0.0, "text": "".join(parts),
            "load1": os.getloadavg()[0]}


def identity(a: dict, b: dict) -> dict:
    """B's output against A's for the same prompt at T = 0 (text: the API carries no token ids)."""
    ta, tb = a["text"], b["text"]
    pos = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    if pos is None and len(ta) != len(tb):
        pos = min(len(ta), len(tb))
    return {"identical": pos is None, "first_divergence_char": pos, "compared_tokens": min(
        a["output_tokens"], b["output_tokens"]), "a_tokens": a["output_tokens"], "b_tokens": b["output_tokens"]}


@dataclass
class EndpointRun:
    """What an endpoint bench measured so far (kept when it fails part-way)."""

    endpoints: list[Endpoint]
    requests: list[dict] = field(default_factory=list)
    concurrency: list[dict] = field(default_factory=list)
    metrics_before: dict = field(default_factory=dict)  # label -> scrape
    metrics_after: dict = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    ended: float | None = None
    error: str | None = None


WARMUP_TOKENS = 8


def run_sequential(run: EndpointRun, prompts: Sequence[Prompt], cfg, write: Callable[[dict], None]) -> None:
    """One untimed warm-up request per endpoint (the first prompt, 8 tokens), then every
    prompt × repeat × T × max_new_tokens on A then B; identity of B against A at T = 0."""
    for ep in run.endpoints:
        stream_one(ep, prompts[0], 0.0, min(WARMUP_TOKENS, cfg.max_new_tokens[0]), cfg.seed, cfg.ignore_eos)
    n = 0
    for rep in range(cfg.repeats):
        for pi, prompt in enumerate(prompts):
            for temp in cfg.temperatures:
                for max_new in cfg.max_new_tokens:
                    seed = cfg.seed + 100_003 * rep + pi
                    first = None
                    for ep in run.endpoints:
                        n += 1
                        rec = {"request_id": f"e{n:05d}", "repeat": rep,
                               **stream_one(ep, prompt, temp, max_new, seed, cfg.ignore_eos), "identity": None}
                        if first is None:
                            first = rec
                        elif temp == 0:
                            rec["identity"] = identity(first, rec)
                        run.requests.append(rec)
                        write(rec)


def run_concurrency(run: EndpointRun, prompts: Sequence[Prompt], cfg, on_row: Callable[[dict], None]) -> None:
    """Per T, N and endpoint: every prompt once with N closed-loop clients in flight."""
    max_new = cfg.max_new_tokens[0]
    for temp in cfg.temperatures:
        for n in cfg.concurrency:
            for ep in run.endpoints:
                jobs = [(p, cfg.seed + i) for i, p in enumerate(prompts)]
                t0 = time.perf_counter()
                pool = ThreadPoolExecutor(max_workers=n)
                try:
                    futures = [pool.submit(stream_one, ep, p, temp, max_new, seed, cfg.ignore_eos) for p, seed in jobs]
                    recs = [f.result() for f in futures]
                finally:  # on a failure: no further requests, only those in flight finish (bounded by the timeout)
                    pool.shutdown(wait=True, cancel_futures=True)
                wall_ms = (time.perf_counter() - t0) * 1000
                tokens = sum(r["output_tokens"] for r in recs)
                row = {"endpoint": ep.label, "url": ep.url, "concurrency": n, "temperature": temp,
                       "max_new_tokens": max_new, "requests": len(recs), "output_tokens": tokens, "wall_ms": wall_ms,
                       "throughput_tok_s": 1000.0 * tokens / wall_ms if wall_ms else 0.0,
                       "latency_ms": distribution(r["wall_ms"] for r in recs),
                       "ttft_ms": distribution(r["ttft_ms"] for r in recs),
                       "tpot_ms": distribution(r["tpot_ms"] for r in recs),
                       "itl_ms": distribution(g for r in recs for g in r["itl_ms"])}
                run.concurrency.append(row)
                on_row(row)
