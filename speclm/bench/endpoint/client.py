"""One OpenAI-compatible server, through the real `openai` client: check it (`connect`)
and stream one request from it (`stream_one`, sent and timed by speclm/loadgen.py), every
failure one line naming the fix.

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
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from ...errors import SpeclmError
from ...loadgen import NotOpenAICompatible, Request, openai_client, timed_request
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
    if isinstance(exc, NotOpenAICompatible):
        return EndpointError(f"{who} is not an OpenAI-compatible server: {what} {exc}: check the URL")
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
    _openai()  # the missing package named before any client is made
    root = base_url(url)
    clients = [openai_client(root, key, timeout) for key in api_keys or [None]]
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


def stream_one(ep: Endpoint, prompt: Prompt, temperature: float, max_tokens: int, seed: int,
               ignore_eos: bool = False) -> dict:
    """One streamed request; its record (times in ms). Raises EndpointError on any failure."""
    if not isinstance(prompt.prompt, str):
        raise EndpointError(f"{prompt.category} prompt {prompt.index} is token ids: --endpoint needs text prompts")
    route = "POST /v1/chat/completions" if prompt.chat else "POST /v1/completions"
    req = Request(prompt.prompt, chat=prompt.chat, max_tokens=max_tokens, temperature=temperature, seed=seed,
                  extra={"ignore_eos": True} if ignore_eos else {})
    tenant = ep.tenant_of(prompt)
    try:
        r = timed_request(ep.clients[tenant], req, model=ep.model, timeout=ep.timeout)
    except Exception as exc:
        raise explain(exc, ep.label, ep.url, route, ep.timeout) from None
    wall = r.latency_s * 1000
    return {"endpoint": ep.label, "url": ep.url, "model": ep.model, "api": "chat" if prompt.chat else "completions",
            "category": prompt.category, "prompt_index": prompt.index, "chat": prompt.chat,
            "temperature": temperature, "max_new_tokens": max_tokens, "seed": seed,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "tokens_from": "usage" if r.completion_tokens is not None else "deltas", "finish_reason": r.finish_reason,
            "wall_ms": wall, "ttft_ms": None if r.ttft_s is None else r.ttft_s * 1000,
            "tpot_ms": None if r.tpot_s is None else r.tpot_s * 1000, "itl_ms": [g * 1000 for g in r.itl_s],
            "deltas": len(r.deltas), "tokens_per_s": 1000.0 * r.output_tokens / wall if wall > 0 else 0.0,
            "text": r.text, "tenant": tenant, "served_by": r.headers.get("x-speclm-replica"),
            "load1": os.getloadavg()[0]}
