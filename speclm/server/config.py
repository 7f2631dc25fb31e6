"""The server's settings, declared once (speclm/options.py): `speclm serve`'s flags
are generated from these fields. ServerConfig is what the app enforces;
ListenConfig is where and how the HTTP server listens."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..options import option
from ..prefix_cache import PREFIX_CACHE_HELP, PREFIX_CACHE_TOKENS
from ..speculative.config import SpecConfig
from ..speculative.proposers.suffix_index import SUFFIX_CACHE_TOKENS
from .connections import ConnectionLimits
from .tenants import split_keys


@dataclass(frozen=True)
class ServerConfig:
    """Server settings. The LLM must hold >= max_concurrency KV sequences
    (LLM(max_sequences=...)). default_spec None: SpecConfig() (method auto)."""

    model_id: str | None = option(None, "the id clients pass as `model` (default: the target's name)")
    max_tokens_limit: int = option(4096, "largest max_tokens accepted")
    max_concurrency: int = option(4, "requests generating at once")
    max_queue: int = option(64, "requests waiting beyond that (then 429)")
    api_key: str | None = None  # one more key (the Python API's shorthand)
    max_body_bytes: int = option(1 << 20, "request body limit (413 beyond)")
    request_timeout_s: float = option(300.0, "seconds before a request is cancelled (504)",
                                      flag="--request-timeout")
    default_spec: SpecConfig | None = None
    body_timeout_s: float = option(30.0, "seconds a client has to send its request body (408 beyond, and the "
                                   "connection closes)", flag="--body-timeout")
    api_keys: tuple[str, ...] = option(
        (), "require `Authorization: Bearer KEY`; repeat it for several tenants (each key drafts only from its "
        "own outputs); prefer SPECLM_API_KEY=KEY[,KEY...] in the environment: a flag is visible to every local "
        "user in `ps` (default: $SPECLM_API_KEY, else none)", flag="--api-key", many="repeat")
    operator_key: str | None = option(
        None, "the key for /metrics, /health's details and clearing any tenant's caches (`Authorization: Bearer "
        "KEY`); prefer SPECLM_OPERATOR_KEY in the environment (default: $SPECLM_OPERATOR_KEY, else none: then "
        "/metrics and /health's details are served to loopback clients only)", flag="--operator-key")
    share_cache: bool = option(False, "let every API key draft from one suffix cache and reuse one prompt KV "
                               "cache (faster for related tenants, but acceptance timing and time to first "
                               "token then leak one tenant's outputs and prompts to another)",
                               flag="--share-suffix-cache")
    prefix_cache_tokens: int = option(PREFIX_CACHE_TOKENS, PREFIX_CACHE_HELP, metavar="N")
    suffix_cache_tokens: int = option(SUFFIX_CACHE_TOKENS, "keep up to N tokens of earlier requests' prompts and "
                                      "outputs per scope (an API key, or all with --share-suffix-cache) for suffix "
                                      "drafting; the oldest requests go first (0: none)", metavar="N")

    @property
    def spec(self) -> SpecConfig:
        """How requests that do not say otherwise speculate (SpecConfig's own default: auto)."""
        return self.default_spec or SpecConfig()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every accepted API key."""
        return tuple(dict.fromkeys(((self.api_key,) if self.api_key else ()) + tuple(self.api_keys)))

    def with_env_keys(self) -> ServerConfig:
        """This config, with $SPECLM_API_KEY's keys when none were given, and
        $SPECLM_OPERATOR_KEY when no operator key was."""
        keys = self.keys or tuple(split_keys(os.environ.get("SPECLM_API_KEY")))
        operator = self.operator_key or os.environ.get("SPECLM_OPERATOR_KEY") or None
        return dataclasses.replace(self, api_keys=keys, operator_key=operator) if keys or operator else self

    def __post_init__(self) -> None:
        keys = self.keys + ((self.operator_key,) if self.operator_key is not None else ())
        if any(not isinstance(k, str) or not k.strip() or k != k.strip() for k in keys):
            raise InvalidRequestError("API keys and the operator key must be non-empty text without surrounding "
                                      "spaces")
        if self.operator_key in self.keys:
            raise InvalidRequestError("the operator key must differ from every API key")
        for name in ("max_tokens_limit", "max_concurrency", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.max_queue < 0 or not self.request_timeout_s > 0 or not self.body_timeout_s > 0:
            raise InvalidRequestError("max_queue must be >= 0, request_timeout_s and body_timeout_s > 0")


@dataclass(frozen=True)
class ListenConfig:
    """Where the server listens and how it treats connections (uvicorn's settings and
    connections.py's bounds, docs/server.md#limits-cancellation-and-shutdown)."""

    host: str = option("127.0.0.1", "bind address (127.0.0.1: local only)")
    port: int = option(8000, "TCP port")
    max_connections: int | None = option(None, "open connections at most; beyond, every route but /health answers "
                                         "503 (default: max-concurrency + max-queue + 32)", kind=int)
    max_connections_per_client: int = option(
        32, "open connections from one client address (an IPv6 /64) at most; a new one beyond is answered 429 and "
        "closed (0: no cap; behind a proxy every client has the proxy's address)", metavar="N")
    header_timeout_s: float = option(10.0, "seconds a connection has to send a request's headers, when it opens "
                                     "and again after each request (then it closes)", flag="--header-timeout")
    keep_alive_timeout: float = option(5.0, "seconds an idle keep-alive connection stays open")
    log_level: str = option("info", "uvicorn's log level",
                            choices=("critical", "error", "warning", "info", "debug"))

    def __post_init__(self) -> None:
        if self.max_connections is not None and self.max_connections < 1 or self.max_connections_per_client < 0:
            raise InvalidRequestError("--max-connections must be >= 1 and --max-connections-per-client >= 0")
        if not self.keep_alive_timeout > 0 or not self.header_timeout_s > 0:
            raise InvalidRequestError("--keep-alive-timeout and --header-timeout must be > 0")

    def connection_limits(self, server: ServerConfig) -> ConnectionLimits:
        """What the HTTP protocol enforces (connections.guarded_protocol)."""
        cap = self.max_connections or server.max_concurrency + server.max_queue + 32
        return ConnectionLimits(self.header_timeout_s, self.max_connections_per_client, cap)
