"""One OpenAI-compatible server, through the real `openai` client: check it (`connect`)
and stream one request from it (`stream_one`), every failure one line naming the fix.

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
Each request is cut off after --endpoint-timeout seconds. No retries.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ...errors import SpeclmError
from ..setup.workloads import Prompt


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
    """One server: label ('A' or 'B'), root URL, the model id it is asked for, one client
    per API key (several keys: several tenants)."""

    label: str
    url: str
    model: str
    api_keys: list[str]
    timeout: float
    clients: list[Any] = field(repr=False, default_factory=list)
    _tenants: dict[str, int] = field(repr=False, default_factory=dict)

    def tenant_of(self, prompt: Prompt) -> int:
        """Which key a prompt is sent with: a category's prompts go as one tenant (the i-th
        category first seen: key i mod keys), so a tenant's later prompts can draft from
        its earlier outputs, as one client's would."""
        return self._tenants.setdefault(prompt.category, len(self._tenants) % len(self.clients))


def explain(exc: BaseException, ep_label: str, url: str, what: str, timeout: float) -> EndpointError:
    """One line naming the endpoint, what failed and the fix."""
    openai, who = _openai(), f"endpoint {ep_label} ({url})"
    import httpx
    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException, TimeoutError)):
        return EndpointError(f"{who} did not answer {what} within {timeout:g} s: raise --endpoint-timeout "
                             "or check that the server is not stuck")
    if isinstance(exc, openai.APIConnectionError) or isinstance(exc, httpx.TransportError):
        cause = exc.__cause__ or exc.__context__ or exc
        return EndpointError(f"cannot reach {who}: {_one_line(cause)}: check the URL and that the server is running")
    key_flag = "--endpoint-api-key-b" if ep_label == "B" else "--endpoint-api-key"
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


def connect(label: str, url: str, api_keys: list[str], model: str | None, timeout: float) -> Endpoint:
    """Check the server (GET /v1/models: reachable, every key accepted, JSON model list) and pick the model."""
    openai, root = _openai(), base_url(url)
    clients = [openai.OpenAI(base_url=root + "/v1", api_key=key, max_retries=0, timeout=timeout)
               for key in api_keys or ["none"]]
    try:
        for client in clients:
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
    return Endpoint(label, root, model or ids[0], list(api_keys), timeout, clients)


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
    tenant = ep.tenant_of(prompt)
    t0 = time.perf_counter()
    try:
        client = ep.clients[tenant]
        api = client.chat.completions if prompt.chat else client.completions
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
            "tenant": tenant, "served_by": resp.headers.get("x-speclm-replica"), "load1": os.getloadavg()[0]}
