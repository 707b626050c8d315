"""Prometheus metrics of the proxy (``GET /metrics``), one registry per app.

Names (``prefixgate_`` prefix), labels ``backend`` and, where it matters, ``status``:
``requests_total``, ``prompt_tokens_total``, ``cached_tokens_total``, ``output_tokens_total``,
``pruned_tokens_total``, ``ttft_seconds`` / ``tpot_seconds`` / ``request_seconds`` histograms;
``upstream_failed_sends_total{deployment, reason}``: sends that were retried or fell over (the
row's ``attempt_reasons``: ``status-503``, ``connect``, ``reset``, ``timeout``, ...).

Resource gauges, read when scraped (:meth:`ProxyMetrics.watch_resources`):
``upstream_responses_in_use`` (upstream responses opened and not yet closed — counted by the
proxy itself), ``upstream_pool_connections{state="active"|"idle"}`` and
``upstream_pool_queued`` (httpx's pool, when readable), ``event_loop_lag_seconds`` (the newest
sample of :class:`proxy.health.LoopLagMonitor`).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cache.ledger import LedgerRow

_LATENCY_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64)


class ProxyMetrics:
    """Counters and histograms fed from finished :class:`~cache.ledger.LedgerRow` records."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("prefixgate_requests_total", "Proxied requests",
                                ["backend", "status"], registry=r)
        self.prompt = Counter("prefixgate_prompt_tokens_total", "Prompt tokens (upstream usage)",
                              ["backend"], registry=r)
        self.cached = Counter("prefixgate_cached_tokens_total", "Prompt tokens served from cache",
                              ["backend"], registry=r)
        self.output = Counter("prefixgate_output_tokens_total", "Output tokens", ["backend"],
                              registry=r)
        self.pruned = Counter("prefixgate_pruned_tokens_total", "Tokens removed by rewriting",
                              ["backend"], registry=r)
        self.ttft = Histogram("prefixgate_ttft_seconds", "Time to first content token",
                              ["backend"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("prefixgate_tpot_seconds", "Time per output token after the first",
                              ["backend"], buckets=_TPOT_BUCKETS, registry=r)
        self.total = Histogram("prefixgate_request_seconds", "Whole request latency",
                               ["backend"], buckets=_LATENCY_BUCKETS, registry=r)
        self.failed_sends = Counter("prefixgate_upstream_failed_sends_total",
                                    "Upstream sends that failed and were retried or fell over",
                                    ["deployment", "reason"], registry=r)

    def watch_resources(self, in_use: Callable[[], float], pool: Callable[[], dict[str, int]],
                        loop_lag_s: Callable[[], float]) -> None:
        """Register the resource gauges (module docstring), each read from its callable at
        scrape time: ``in_use()`` responses, ``pool()`` ``{"active", "idle", "queued"}`` (a
        missing key reads 0), ``loop_lag_s()`` seconds."""
        r = self.registry
        Gauge("prefixgate_upstream_responses_in_use", "Upstream responses opened, not yet closed",
              registry=r).set_function(in_use)
        conns = Gauge("prefixgate_upstream_pool_connections", "Upstream pool connections",
                      ["state"], registry=r)
        for state in ("active", "idle"):
            conns.labels(state).set_function(_reader(pool, state))
        Gauge("prefixgate_upstream_pool_queued", "Requests waiting for an upstream connection",
              registry=r).set_function(_reader(pool, "queued"))
        Gauge("prefixgate_event_loop_lag_seconds", "Event-loop lag, newest sample",
              registry=r).set_function(loop_lag_s)

    def observe(self, row: LedgerRow) -> None:
        """Count one finished request."""
        b = row.backend or "none"
        self.requests.labels(b, row.status).inc()
        self.prompt.labels(b).inc(row.prompt_tokens or 0)
        self.cached.labels(b).inc(row.cached_tokens or 0)
        self.output.labels(b).inc(row.output_tokens or 0)
        self.pruned.labels(b).inc(row.tokens_pruned)
        if row.ttft_ms is not None:
            self.ttft.labels(b).observe(row.ttft_ms / 1e3)
        if row.tpot_ms is not None:
            self.tpot.labels(b).observe(row.tpot_ms / 1e3)
        if row.total_ms is not None:
            self.total.labels(b).observe(row.total_ms / 1e3)
        for failed in filter(None, row.attempt_reasons.split(",")):
            deployment, _, reason = failed.rpartition(":")
            self.failed_sends.labels(deployment, reason).inc()

    def render(self) -> bytes:
        """Text exposition format."""
        return generate_latest(self.registry)


def _reader(stats: Callable[[], dict[str, int]], key: str) -> Callable[[], float]:
    """A gauge callback reading ``stats()[key]`` (0 when missing)."""
    return lambda: stats().get(key, 0)
