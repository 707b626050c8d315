"""Prometheus metrics of the engine server (own registry, served at ``GET /metrics``).

SGLang prints one log line per decode batch (``#running-req``, ``#token``, ``token usage``,
``#queue-req``, ``gen throughput (token/s)``, cache hit rate); the same figures are exposed here
as metrics, read from ``engine.stats()`` at scrape time, beside request-level histograms the
server observes itself:

==============================================  =======  ==========================================
name                                            type     meaning (unit)
==============================================  =======  ==========================================
``engine_kv_slots_used``                        gauge    KV pool slots in use (tokens)
``engine_kv_slots_total``                       gauge    KV pool capacity (tokens)
``engine_kv_pool_usage_ratio``                  gauge    used / total (0..1)
``engine_num_running_requests``                 gauge    requests in the running batch
``engine_num_waiting_requests``                 gauge    requests queued for admission
``engine_prefill_tokens_per_second``            gauge    recent prefill throughput (tokens/s)
``engine_decode_tokens_per_second``             gauge    recent decode throughput (tokens/s)
``engine_prompt_tokens_total``                  counter  prompt tokens admitted
``engine_cache_hit_tokens_total``               counter  prompt tokens served from the radix cache
``engine_span_reused_tokens_total``             counter  of those, reused across a changed span
``engine_prefill_tokens_total``                 counter  prompt tokens computed (not cached)
``engine_decode_tokens_total``                  counter  tokens computed by decode steps
``engine_retractions_total``                    counter  requests preempted for KV space
``engine_evicted_slots_total``                  counter  KV slots evicted from the radix cache
``engine_generation_tokens_total``              counter  completion tokens returned (server side)
``engine_requests_total{finish_reason}``        counter  finished requests
``engine_time_to_first_token_seconds``          hist.    TTFT: request received -> first token (s)
``engine_time_per_output_token_seconds``        hist.    TPOT: (last - first token) / (n - 1) (s)
``engine_e2e_request_latency_seconds``          hist.    request received -> finished (s)
``engine_prompt_tokens_by_source{source}``      counter  prompt tokens by where their KV came from:
                                                         computed / local_cache_hit /
                                                         external_kv_transfer (vLLM's split)
``engine_kv_transfers``                         counter  P/D transfers sent / imported
``engine_kv_transfer_tokens``                   counter  tokens whose KV a P/D transfer moved
``engine_kv_transfer_seconds``                  counter  seconds in P/D send / receive + import
``engine_kv_transfer_failures{reason}``         counter  P/D transfers dropped (timeout,
                                                         link_down, gap, no_room, ...)
``engine_kv_transfer_pending``                  gauge    imports waiting for their decode request
``engine_kv_link_up``                           gauge    1 while the P/D link is paired
``engine_kv_link_pairings``                     counter  P/D pairings (each proven, pd/auth.py)
``engine_kv_link_repairs``                      counter  pairings after the first (a lost peer
                                                         came back, e.g. a restarted decode)
``engine_kv_link_pairing_failures{reason}``     counter  pairings refused or failed (auth,
                                                         second_rank, layout, rendezvous, error)
==============================================  =======  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixgate.local_engine.spec.metrics import SpecCollector

__all__ = ["CONTENT_TYPE", "EngineMetrics", "stats_log_line"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_GAUGES = (
    ("engine_kv_slots_used", "KV pool slots in use (tokens).", "kv_slots_used"),
    ("engine_kv_slots_total", "KV pool capacity (tokens).", "kv_slots_total"),
    ("engine_kv_slots_cached", "KV slots held by the radix prefix cache (tokens).",
     "kv_slots_cached"),
    ("engine_num_running_requests", "Requests in the running batch.", "num_running"),
    ("engine_num_waiting_requests", "Requests waiting for admission.", "num_waiting"),
    ("engine_prefill_tokens_per_second", "Recent prefill throughput (tokens/s).",
     "prefill_tokens_per_s"),
    ("engine_decode_tokens_per_second", "Recent decode throughput (tokens/s).",
     "decode_tokens_per_s"),
)
_COUNTERS = (
    ("engine_prompt_tokens", "Prompt tokens admitted.", "prompt_tokens_total"),
    ("engine_cache_hit_tokens", "Prompt tokens served from the radix prefix cache.",
     "cache_hit_tokens_total"),
    ("engine_span_reused_tokens", "Cache-hit prompt tokens reused across a changed span "
     "(span reuse).", "span_reused_tokens_total"),
    ("engine_prefill_tokens", "Prompt tokens computed by prefill (not cached).",
     "prefill_tokens_total"),
    ("engine_decode_tokens", "Tokens computed by decode steps.", "decode_tokens_total"),
    ("engine_retractions", "Running requests preempted for lack of KV slots.",
     "retractions_total"),
    ("engine_evicted_slots", "KV slots evicted from the radix cache.", "evicted_slots_total"),
)


class _StatsCollector(Collector):
    """Reads ``stats()`` (the engine's dict) at each scrape and yields gauges / counters."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for name, doc, key in _GAUGES:
            if key in s:
                yield GaugeMetricFamily(name, doc, value=float(s[key]))
        total = float(s.get("kv_slots_total") or 0)
        if total:
            yield GaugeMetricFamily(
                "engine_kv_pool_usage_ratio",
                "KV pool usage: used / total slots (0..1).",
                value=float(s.get("kv_slots_used", 0)) / total,
            )
        for name, doc, key in _COUNTERS:
            if key in s:
                yield CounterMetricFamily(name, doc, value=float(s[key]))
        yield from _pd_metrics(s)


def _labelled(s: dict[str, Any], prefix: str, name: str, doc: str, label: str) -> Iterator[Metric]:
    """``prefix:<value>`` keys of ``s`` as one counter family labelled ``label``."""
    keys = [k for k in s if k.startswith(prefix + ":")]
    if keys:
        fam = CounterMetricFamily(name, doc, labels=[label])
        for k in sorted(keys):
            fam.add_metric([k.split(":", 1)[1]], float(s[k]))
        yield fam


def _pd_metrics(s: dict[str, Any]) -> Iterator[Metric]:
    """The P/D and prompt-source metrics (``server/pd_handoff.py``'s ``stats()`` keys)."""
    yield from _labelled(s, "prompt_tokens_by_source", "engine_prompt_tokens_by_source",
                         "Prompt tokens by where their KV came from.", "source")
    yield from _labelled(s, "kv_transfer_failures_total", "engine_kv_transfer_failures",
                         "P/D KV transfers dropped, by reason.", "reason")
    yield from _labelled(s, "kv_link_pairing_failures_total", "engine_kv_link_pairing_failures",
                         "P/D pairings refused or failed, by reason.", "reason")
    for name, doc, key in (
            ("engine_kv_link_pairings", "P/D link pairings (both peers proven).",
             "kv_link_pairings_total"),
            ("engine_kv_link_repairs", "P/D link pairings after the first (a lost peer came back).",
             "kv_link_repairs_total"),
            ("engine_kv_transfers", "P/D KV transfers sent or imported.", "kv_transfers_total"),
            ("engine_kv_transfer_tokens", "Tokens whose KV a P/D transfer moved.",
             "kv_transfer_tokens_total"),
            ("engine_kv_transfer_seconds", "Seconds in P/D KV send or receive + import.",
             "kv_transfer_seconds_total")):
        if key in s:
            yield CounterMetricFamily(name, doc, value=float(s[key]))
    if "kv_link_up" in s:
        yield GaugeMetricFamily("engine_kv_link_up", "1 while the P/D link is paired.",
                                value=float(s["kv_link_up"]))
    if "kv_transfer_pending" in s:
        yield GaugeMetricFamily("engine_kv_transfer_pending",
                                "P/D imports waiting for their decode request.",
                                value=float(s["kv_transfer_pending"]))


class EngineMetrics:
    """The server's metrics in a private ``CollectorRegistry`` (safe to build many per process).

    ``stats`` is the engine's ``stats()`` method, polled only when ``/metrics`` is scraped.
    """

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats))
        self.registry.register(SpecCollector(stats))  # spec_metrics.py documents its names
        self.ttft = Histogram(
            "engine_time_to_first_token_seconds", "Time to first token (s).",
            buckets=TTFT_BUCKETS_S, registry=self.registry,
        )
        self.tpot = Histogram(
            "engine_time_per_output_token_seconds", "Time per output token after the first (s).",
            buckets=TPOT_BUCKETS_S, registry=self.registry,
        )
        self.e2e = Histogram(
            "engine_e2e_request_latency_seconds", "Request latency, received to finished (s).",
            buckets=E2E_BUCKETS_S, registry=self.registry,
        )
        self.generation_tokens = Counter(
            "engine_generation_tokens", "Completion tokens returned.", registry=self.registry
        )
        self.requests = Counter(
            "engine_requests", "Finished requests by finish reason.", ["finish_reason"],
            registry=self.registry,
        )

    def observe_request(
        self,
        *,
        ttft_s: float | None,
        tpot_s: float | None,
        e2e_s: float,
        completion_tokens: int,
        finish_reason: str,
    ) -> None:
        """Record one finished request (times in seconds; None = no token was produced /
        fewer than two tokens, so that figure is undefined)."""
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        self.e2e.observe(e2e_s)
        self.generation_tokens.inc(completion_tokens)
        self.requests.labels(finish_reason=finish_reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (format 0.0.4)."""
        return bytes(generate_latest(self.registry))


def stats_log_line(stats: dict[str, Any]) -> str:
    """SGLang-style one-line engine status from ``engine.stats()``, e.g.
    ``#running-req: 2, #queue-req: 0, #token: 4410, token usage: 0.19, cache hit rate: 0.84,
    prefill throughput (token/s): 812.0, gen throughput (token/s): 21.5``."""
    total = float(stats.get("kv_slots_total") or 0)
    used = float(stats.get("kv_slots_used") or 0)
    prompt = float(stats.get("prompt_tokens_total") or 0)
    hit = float(stats.get("cache_hit_tokens_total") or 0)
    return (
        f"#running-req: {int(stats.get('num_running', 0))}, "
        f"#queue-req: {int(stats.get('num_waiting', 0))}, "
        f"#token: {int(used)}, token usage: {used / total if total else 0.0:.2f}, "
        f"cache hit rate: {hit / prompt if prompt else 0.0:.2f}, "
        f"prefill throughput (token/s): {float(stats.get('prefill_tokens_per_s', 0.0)):.1f}, "
        f"gen throughput (token/s): {float(stats.get('decode_tokens_per_s', 0.0)):.1f}"
    )
