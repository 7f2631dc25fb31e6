"""Load on an OpenAI-compatible server as its clients send it: one request timed on the
client (`timed_request`), and N closed-loop clients working through a run of requests
(`run_clients`). The endpoint bench (bench/endpoint/), the server's load test
(server/loadtest.py) and the memory soak (scripts/soak.py) all send through here.

A request goes through the real `openai` client (`openai_client`): to
/v1/chat/completions as one user message when `Request.chat`, else to
/v1/completions as text; streamed with stream_options.include_usage when
`Request.stream`. Times are time.perf_counter() seconds taken on the client, so
network and queueing are included. No retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import openai

T = TypeVar("T")
R = TypeVar("R")


class NotOpenAICompatible(Exception):
    """What answered a completion request is not an OpenAI-compatible stream; the message
    says what it sent instead (it reads after the route: 'POST /v1/completions <message>')."""


@dataclass(frozen=True)
class Request:
    """One completion request. `extra`: fields outside the OpenAI API sent in the body as
    given (speclm's `speculative`, `ignore_eos`); `seed` None: none sent."""

    prompt: str
    chat: bool = False
    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    stream: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """What the client saw of one request: `t0` when it was sent, `end` when the answer
    was read whole, `deltas` the arrival time of each non-empty content delta (one at
    `end` for a whole answer with text); token counts from the server's usage (None
    when it sent none)."""

    t0: float
    end: float
    deltas: list[float]
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    headers: Mapping[str, str]

    @property
    def output_tokens(self) -> int:
        """The server's completion-token count, else the number of deltas."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.deltas)

    @property
    def latency_s(self) -> float:
        return self.end - self.t0

    @property
    def ttft_s(self) -> float | None:
        """Sent → first non-empty content delta (None: no text came)."""
        return self.deltas[0] - self.t0 if self.deltas else None

    @property
    def tpot_s(self) -> float | None:
        """(last delta − first delta) / (output tokens − 1): None under two deltas or two tokens."""
        n = self.output_tokens
        return (self.deltas[-1] - self.deltas[0]) / (n - 1) if len(self.deltas) > 1 and n > 1 else None

    @property
    def itl_s(self) -> list[float]:
        """The gaps between successive content deltas (a server that streams several tokens
        in one delta shows one gap for them)."""
        return [b - a for a, b in zip(self.deltas, self.deltas[1:])]


def openai_client(url: str, api_key: str | None, timeout: float) -> openai.OpenAI:
    """A client of the server whose root URL ('http://host:8000') is `url`; no retries,
    `timeout` seconds for any one read. No key: a placeholder (servers without keys ignore it)."""
    import openai
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or "none", max_retries=0,
                         timeout=timeout)


def _text(chunk: Any, chat: bool, stream: bool) -> tuple[str, str | None]:
    """(text, finish reason) of a streamed chunk or a whole answer."""
    if not chunk.choices:
        return "", None
    c = chunk.choices[0]
    if not chat:
        text = c.text
    elif stream:
        text = c.delta.content if c.delta is not None else None
    else:
        text = c.message.content
    return text or "", c.finish_reason


def timed_request(client: openai.OpenAI, req: Request, *, model: str | None, timeout: float) -> Reply:
    """Send `req` (`model` None: no model named, the server's own) and time it. Raises what
    the client raises (openai.APIError and its kinds, httpx errors), TimeoutError once the
    request has taken `timeout` seconds in all, NotOpenAICompatible for an answer that is
    no completion."""
    import openai
    api = client.chat.completions if req.chat else client.completions
    body = {"messages": [{"role": "user", "content": req.prompt}]} if req.chat else {"prompt": req.prompt}
    kw: dict[str, Any] = dict(model=model if model is not None else openai.omit, max_tokens=req.max_tokens,
                              temperature=req.temperature, seed=req.seed if req.seed is not None else openai.omit,
                              timeout=timeout, stream=req.stream)
    if req.stream:
        kw["stream_options"] = {"include_usage": True}
    if req.extra:
        kw["extra_body"] = dict(req.extra)
    deltas: list[float] = []
    parts: list[str] = []
    usage, finish = None, None
    t0 = time.perf_counter()
    with api.with_streaming_response.create(**body, **kw) as resp:
        ctype = resp.headers.get("content-type", "")
        if req.stream and "text/event-stream" not in ctype:
            raise NotOpenAICompatible(f"with stream=true answered {(ctype or 'no content type')[:60]}, "
                                      "not an event stream")
        parsed = resp.parse()
        for chunk in parsed if req.stream else [parsed]:
            now = time.perf_counter()
            if now - t0 > timeout:
                raise TimeoutError
            usage = chunk.usage or usage
            text, fin = _text(chunk, req.chat, req.stream)
            finish = fin or finish
            if text:
                deltas.append(now)
                parts.append(text)
        headers = resp.headers
    end = time.perf_counter()
    if not deltas and finish is None and usage is None:
        raise NotOpenAICompatible("streamed no completion events" if req.stream else "answered no completion")
    return Reply(t0, end, deltas, "".join(parts), finish, usage.prompt_tokens if usage is not None else None,
                 usage.completion_tokens if usage is not None else None, headers)


@dataclass
class Load(Generic[R]):
    """What `run_clients` gathered: `results` in the order their items were taken,
    `errors` in the order they happened, `wall_s` from the first client's start to the
    last one's end."""

    results: list[R] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.results) + len(self.errors)


_END = object()


def run_clients(clients: int, items: Iterable[T], send: Callable[[T], R], *, until: float | None = None,
                stop: threading.Event | None = None, keep_errors: bool = False) -> Load[R]:
    """`clients` threads, each taking the next of `items` and calling `send` on it, one after
    another (a closed loop), until the items run out, time.perf_counter() passes `until`,
    or `stop` is set; a request once sent always finishes. With `keep_errors` a failing
    `send` is kept in `errors` and its client goes on; without, no client takes another
    item and the first failure is raised once the requests in flight have finished.
    Where `items` has a length, no more clients start than it has items."""
    source = iter(items)
    n = min(clients, len(items)) if isinstance(items, Sized) else clients
    lock, failed = threading.Lock(), threading.Event()
    load: Load[R] = Load()
    done: list[tuple[int, R]] = []
    taken = 0

    def client() -> None:
        nonlocal taken
        while not failed.is_set() and not (stop is not None and stop.is_set()) and (
                until is None or time.perf_counter() < until):
            with lock:
                item, index = next(source, _END), taken
                taken += 1
            if item is _END:
                return
            try:
                result = send(item)  # type: ignore[arg-type]
            except Exception as exc:  # kept or raised, never hidden
                with lock:
                    load.errors.append(exc)
                if not keep_errors:
                    failed.set()
                continue
            with lock:
                done.append((index, result))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    load.wall_s = time.perf_counter() - t0
    load.results = [r for _, r in sorted(done, key=lambda x: x[0])]
    if load.errors and not keep_errors:
        raise load.errors[0]
    return load
