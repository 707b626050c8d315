"""Prometheus metrics of the KV event streams (issue 24), read from the hub at scrape time.

Per deployment (label ``deployment``, the policy's name — the endpoint, which may carry a host
name, never is):

- ``prefixgate_kv_events_batches_total`` — event batches applied (live and replayed);
- ``prefixgate_kv_events_gaps_total`` — sequence gaps seen (a batch number skipped);
- ``prefixgate_kv_events_replays_total`` — replay requests (gap repairs, liveness probes, resyncs);
- ``prefixgate_kv_events_resyncs_total`` — full resyncs (connects, publisher restarts, holes a
  replay could not fill);
- ``prefixgate_kv_events_bad_total`` — events or batches not understood (skipped);
- ``prefixgate_kv_events_undecodable_total`` — batches whose payload could not be read, live or
  replayed (skipped: their number passes, no resync);
- ``prefixgate_kv_events_index_blocks`` — blocks in the index now;
- ``prefixgate_kv_events_usable`` — 1 while the index is synced and fresh (routing uses it);
- ``prefixgate_kv_events_staleness_seconds`` — since the stream was last seen alive (an event
  or an answered probe; ``+Inf`` before the first);
- ``prefixgate_kv_events_lag_seconds{quantile="0.5"|"0.99"}`` — a batch's delay, receive time
  minus its ``ts``, over the last 10,000 live batches (absent before any).

And, with summaries shared through Redis (:mod:`prefixgate.proxy.routing.kv_shared`):
``prefixgate_kv_index_summaries_published_total`` and ``prefixgate_kv_index_summary_reads_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixgate.proxy.routing.kv_events import KVEventHub


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class KVEventsCollector(Collector):
    """The metrics above for the hub ``hub()`` returns (None: no streams, no metrics)."""

    def __init__(self, hub: Callable[[], KVEventHub | None]) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        """One family per metric, a sample per deployment."""
        hub = self.hub()
        if hub is None or not hub.streams:
            return
        counters = {name: CounterMetricFamily(f"prefixgate_kv_events_{name}", doc,
                                              labels=["deployment"])
                    for name, doc in (("batches", "KV event batches applied"),
                                      ("gaps", "KV event sequence gaps seen"),
                                      ("replays", "KV event replay requests"),
                                      ("resyncs", "KV event index full resyncs"),
                                      ("bad", "KV events or batches not understood"),
                                      ("undecodable", "KV event batches that could not be read"))}
        blocks = GaugeMetricFamily("prefixgate_kv_events_index_blocks", "Blocks in the KV index",
                                   labels=["deployment"])
        usable = GaugeMetricFamily("prefixgate_kv_events_usable",
                                   "1 while the KV index is synced and fresh", labels=["deployment"])
        stale = GaugeMetricFamily("prefixgate_kv_events_staleness_seconds",
                                  "Seconds since the KV event stream was last seen alive",
                                  labels=["deployment"])
        lag = GaugeMetricFamily("prefixgate_kv_events_lag_seconds",
                                "KV event batch delay (receive - ts)",
                                labels=["deployment", "quantile"])
        for name, s in sorted(hub.streams.items()):
            counters["batches"].add_metric([name], float(s.batches))
            counters["gaps"].add_metric([name], float(s.gaps))
            counters["replays"].add_metric([name], float(s.replays))
            counters["resyncs"].add_metric([name], float(s.resyncs))
            counters["bad"].add_metric([name], float(s.index.bad))
            counters["undecodable"].add_metric([name], float(s.undecodable))
            blocks.add_metric([name], float(len(s.index)))
            usable.add_metric([name], 1.0 if s.usable() else 0.0)
            stale.add_metric([name], s.staleness_s())
            lags = list(s.lags_ms)
            if lags:
                for q in (0.5, 0.99):
                    lag.add_metric([name, str(q)], _quantile(lags, q) / 1e3)
        yield from counters.values()
        yield from (blocks, usable, stale, lag)
        if hub.shared is not None:
            yield CounterMetricFamily("prefixgate_kv_index_summaries_published",
                                      "KV index summaries written to the shared state",
                                      value=float(hub.shared.publishes))
            yield CounterMetricFamily("prefixgate_kv_index_summary_reads",
                                      "Shared KV index summary reads",
                                      value=float(hub.shared.reads))
