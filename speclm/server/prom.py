"""Prometheus metrics of one server app, on a private CollectorRegistry.

Speculative metrics follow docs/design.md#metrics, accumulated over finished
requests per method:
- acceptance rate          = Σ accepted / Σ drafted        (gauge, and the two counters)
- mean acceptance length   = Σ (a_r + 1) / Σ rounds         (gauge, and the rounds counter)
- per-position acceptance  = accepted_at[j] / proposed_at[j] (counter pair per position j)

The SSD speculator: speclm_speculator_up (1 alive, 0 lost) and
speclm_speculator_restarts_total, once an ssd request has started one.

The suffix caches, per scope (`scope`: a tenant id, or "shared"): cached
tokens and requests, the bound, lookups, hits, evictions and the hit rate
(hits / lookups; clearing a cache resets its counters).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import GenerationResult

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class _SpeculatorCollector:
    """The SSD speculator's state, read at each scrape (no samples before it exists)."""

    def __init__(self, state: Callable[[], dict | None]):
        self.state = state

    def _families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (GaugeMetricFamily("speclm_speculator_up", "1 while the SSD speculator is alive, 0 once lost "
                                  "(requests then draft synchronously until it is restarted)"),
                CounterMetricFamily("speclm_speculator_restarts", "SSD speculators started to replace a lost one"))

    def describe(self):
        return self._families()

    def collect(self):
        up, restarts = self._families()
        s = self.state()
        if s is not None:
            up.add_metric([], 1.0 if s["state"] == "alive" else 0.0)
            restarts.add_metric([], float(s["restarts"]))
        return up, restarts


class _ScopeCollector:
    """Per-scope cache figures (`stats()`: {scope: {field: value}}), one labelled
    sample per scope and family, read at each scrape."""

    def __init__(self, stats: Callable[[], dict[str | None, dict]]):
        self.stats = stats

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        raise NotImplementedError

    @staticmethod
    def _row(st: dict) -> dict:
        return st

    def describe(self):
        return list(self._families().values())

    def collect(self):
        families = self._families()
        for scope, st in sorted(self.stats().items(), key=lambda kv: kv[0] or ""):
            st = self._row(st)
            for name, family in families.items():
                family.add_metric(["shared" if scope is None else scope], float(st[name]))
        return list(families.values())


class _SuffixCacheCollector(_ScopeCollector):
    """The suffix caches' sizes and hit counts."""

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        g, c, s = GaugeMetricFamily, CounterMetricFamily, ["scope"]
        return {"cached_tokens": g("speclm_suffix_cache_tokens", "tokens held by the suffix cache", labels=s),
                "max_tokens": g("speclm_suffix_cache_max_tokens", "the suffix cache's bound in tokens", labels=s),
                "cached_requests": g("speclm_suffix_cache_requests", "earlier requests held by the suffix cache",
                                     labels=s),
                "lookups": c("speclm_suffix_cache_lookups", "drafting rounds that looked the cache up", labels=s),
                "hits": c("speclm_suffix_cache_hits", "lookups that found a continuation", labels=s),
                "evicted_requests": c("speclm_suffix_cache_evicted_requests", "requests evicted to keep the "
                                      "bound", labels=s),
                "hit_rate": g("speclm_suffix_cache_hit_rate", "hits / lookups since the cache was last cleared",
                              labels=s)}

    @staticmethod
    def _row(st: dict) -> dict:
        return dict(st, hit_rate=st["hits"] / st["lookups"] if st["lookups"] else 0.0)


class _PrefixCacheCollector(_ScopeCollector):
    """The prompt KV caches' sizes and reuse counts."""

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        g, c, s = GaugeMetricFamily, CounterMetricFamily, ["scope"]
        return {"tokens": g("speclm_prefix_cache_tokens", "tokens of KV held by the prefix cache", labels=s),
                "bytes": g("speclm_prefix_cache_bytes", "host memory those KV copies take", labels=s),
                "entries": g("speclm_prefix_cache_entries", "finished requests' KV copies held", labels=s),
                "lookups": c("speclm_prefix_cache_lookups", "requests that looked the cache up", labels=s),
                "hits": c("speclm_prefix_cache_hits", "requests that reused a cached prompt start", labels=s),
                "live_hits": c("speclm_prefix_cache_live_hits", "of those, requests that took it from a "
                               "running request's KV", labels=s),
                "reused_tokens": c("speclm_prefix_cache_reused_tokens", "prompt tokens restored instead of "
                                   "prefilled", labels=s),
                "evicted": c("speclm_prefix_cache_evicted", "copies evicted to keep the bound", labels=s),
                "failed": c("speclm_prefix_cache_failed", "KV copies llama.cpp would not take out or put back "
                            "(the request was served uncached)", labels=s)}


class ServerMetrics:
    """All metrics of one app. `load()` returns the engine's (running, queued);
    `speculator()` the SSD speculator's state (LLM.speculator_state);
    `suffix_caches()` each scope's suffix cache stats (LLM.suffix_cache_stats),
    `prefix_caches()` each scope's prompt KV cache stats (LLM.prefix_cache_stats)."""

    def __init__(self, load: Callable[[], tuple[int, int]] | None,
                 speculator: Callable[[], dict | None] = lambda: None,
                 suffix_caches: Callable[[], dict[str | None, dict]] = dict,
                 prefix_caches: Callable[[], dict[str | None, dict]] = dict):
        self.registry = r = CollectorRegistry()
        r.register(_SpeculatorCollector(speculator))
        r.register(_SuffixCacheCollector(suffix_caches))
        r.register(_PrefixCacheCollector(prefix_caches))
        self.requests = Counter("speclm_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.latency = Histogram("speclm_request_duration_seconds", "HTTP request latency "
                                 "(streams: until the last byte)", ["route"], buckets=_LATENCY_BUCKETS,
                                 registry=r)
        self.ttft = Histogram("speclm_time_to_first_token_seconds", "time from submission to the "
                              "first generated token (queueing included)", ["method"],
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("speclm_time_per_output_token_seconds", "mean time per output token "
                              "after the first", ["method"], buckets=_TPOT_BUCKETS, registry=r)
        self.prompt_tokens = Counter("speclm_prompt_tokens", "prompt tokens of finished requests",
                                     registry=r)
        self.completion_tokens = Counter("speclm_completion_tokens", "tokens generated and returned",
                                         ["method"], registry=r)
        self.finished = Counter("speclm_generations", "finished generations by method and finish "
                                "reason", ["method", "finish_reason"], registry=r)
        self.drafted = Counter("speclm_spec_drafted_tokens", "draft tokens proposed (Σ K_r)",
                               ["method"], registry=r)
        self.accepted = Counter("speclm_spec_accepted_tokens", "draft tokens accepted (Σ a_r)",
                                ["method"], registry=r)
        self.rounds = Counter("speclm_spec_rounds", "rounds = target forwards that emit tokens (the first "
                              "also prefills the prompt's last chunk)",
                              ["method"], registry=r)
        self.pos_proposed = Counter("speclm_spec_position_proposed", "rounds that drafted a token "
                                    "at position j (K_r >= j)", ["method", "position"], registry=r)
        self.pos_accepted = Counter("speclm_spec_position_accepted", "rounds that accepted the "
                                    "draft token at position j (a_r >= j)", ["method", "position"],
                                    registry=r)
        self.acceptance_rate = Gauge("speclm_spec_acceptance_rate", "Σ accepted / Σ drafted since "
                                     "start", ["method"], registry=r)
        self.mean_acceptance_length = Gauge("speclm_spec_mean_acceptance_length", "Σ (a_r + 1) / "
                                            "rounds since start (tokens per target forward)",
                                            ["method"], registry=r)
        if load is not None:  # None: an app without an engine of its own (a Ray ingress)
            Gauge("speclm_requests_running", "requests generating now", registry=r).set_function(
                lambda: load()[0])
            Gauge("speclm_requests_queued", "requests waiting for a slot", registry=r).set_function(
                lambda: load()[1])
        self._lock = threading.Lock()
        self._totals: dict[str, list[int]] = {}  # method -> [drafted, accepted, rounds]

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_result(self, r: GenerationResult) -> None:
        """Account one finished (or cancelled) generation."""
        m, s = r.method, r.summary
        self.prompt_tokens.inc(r.prompt_tokens)
        self.completion_tokens.labels(m).inc(len(r.token_ids))
        self.finished.labels(m, r.finish_reason).inc()
        if s is None:
            return
        if s.ttft_ms is not None:
            self.ttft.labels(m).observe(s.ttft_ms / 1000)
        if s.tpot_ms is not None:
            self.tpot.labels(m).observe(s.tpot_ms / 1000)
        proposed_at: dict[int, int] = {}
        accepted_at: dict[int, int] = {}
        for rnd in r.rounds:
            for j in range(1, rnd.proposed + 1):
                proposed_at[j] = proposed_at.get(j, 0) + 1
                accepted_at[j] = accepted_at.get(j, 0) + (rnd.accepted >= j)
        for j, n in proposed_at.items():
            self.pos_proposed.labels(m, str(j)).inc(n)
            self.pos_accepted.labels(m, str(j)).inc(accepted_at[j])
        self.drafted.labels(m).inc(s.proposed)
        self.accepted.labels(m).inc(s.accepted)
        self.rounds.labels(m).inc(s.rounds)
        with self._lock:
            t = self._totals.setdefault(m, [0, 0, 0])
            t[0] += s.proposed
            t[1] += s.accepted
            t[2] += s.rounds
            if t[0]:
                self.acceptance_rate.labels(m).set(t[1] / t[0])
            if t[2]:
                self.mean_acceptance_length.labels(m).set((t[1] + t[2]) / t[2])

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def merge_expositions(parts: dict[str, bytes], label: str = "replica") -> bytes:
    """One Prometheus exposition from several (e.g. each replica's), every sample
    labelled `label`=its part's name; families of the same name are joined."""
    families: dict[str, Metric] = {}
    for name, body in parts.items():
        for family in text_string_to_metric_families(body.decode()):
            joined = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            for s in family.samples:
                joined.samples.append(s._replace(labels={**s.labels, label: name}))
    registry = CollectorRegistry()
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector of ready-made families."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


class RequestMetrics:
    """ASGI middleware: count every HTTP request by route and status, and time
    it to its last byte. Unknown paths share the route label "other"."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, t0, status = scope["path"], time.perf_counter(), 500
        route = path if path in _ROUTES else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.observe_request(route, status, time.perf_counter() - t0)
