"""The event streams' counters exported as Prometheus metrics (observe.kv_events_metrics), read
from a stream following the engine's real publisher, and on the app's ``/metrics``."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry

from prefixgate.config.routing import Deployment
from prefixgate.proxy.observe.kv_events_metrics import KVEventsCollector
from prefixgate.proxy.routing.kv_events import KVEventHub, KVEventStream
from tests.kv_events.helpers import Published, until

A = list(range(100, 112))  # 3 blocks of 4


@pytest.fixture
def published() -> object:
    p = Published()
    yield p
    p.close()


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, {"deployment": "d0", **labels})


async def test_each_counter_of_the_stream_is_exported(published: Published) -> None:
    s = KVEventStream("d0", published.settings(max_staleness_s=0.3))
    hub = KVEventHub({"d0": s})
    reg = CollectorRegistry()
    reg.register(KVEventsCollector(lambda: hub))
    assert _value(reg, "prefixgate_kv_events_usable") == 0.0
    assert _value(reg, "prefixgate_kv_events_lag_seconds", quantile="0.99") is None
    assert await s.resync()
    assert _value(reg, "prefixgate_kv_events_resyncs_total") == 1.0
    assert _value(reg, "prefixgate_kv_events_usable") == 1.0
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced and s.resyncs == 2)  # run() resyncs at its connect
        await asyncio.sleep(0.1)  # the SUB has joined: the batch below arrives live
        published.insert(A)
        await until(lambda: len(s.index) == 3 and len(s.lags_ms) > 0)
        assert _value(reg, "prefixgate_kv_events_index_blocks") == 3.0
        assert _value(reg, "prefixgate_kv_events_batches_total") == float(s.batches) > 0
        assert _value(reg, "prefixgate_kv_events_replays_total") == float(s.replays) >= 2
        lag = _value(reg, "prefixgate_kv_events_lag_seconds", quantile="0.99")
        assert lag is not None and 0 <= lag < 2
        assert _value(reg, "prefixgate_kv_events_gaps_total") == 0.0
        s.gaps += 2  # as a gap's handling counts it
        assert _value(reg, "prefixgate_kv_events_gaps_total") == 2.0
        stale = _value(reg, "prefixgate_kv_events_staleness_seconds")
        assert stale is not None and 0 <= stale < 1
    finally:
        task.cancel()
    await s.handle(s.seq.last + 1, b"not msgpack")
    assert _value(reg, "prefixgate_kv_events_bad_total") == 1.0
    assert _value(reg, "prefixgate_kv_events_undecodable_total") == 1.0  # skipped, counted


def test_no_hub_no_samples() -> None:
    reg = CollectorRegistry()
    reg.register(KVEventsCollector(lambda: None))
    assert not [m for m in reg.collect() if m.samples]


async def test_the_apps_metrics_show_its_streams(published: Published) -> None:
    from prefixgate.cache.ledger.store import Ledger
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.app import build_app

    dep = Deployment(base_url="http://10.0.0.1:8000/v1", name="d0",
                     kv_events=published.settings())
    policy = parse_policy({"backends": {"g": {"kind": "openai_compat",
                                              "deployments": [dep.model_dump()],
                                              "affinity": {"mode": "exact"}}},
                           "routes": [{"match": "*", "backend": "g"}]})
    app = build_app(policy, ledger=Ledger(":memory:"), rewrite_fn=None, analyze=False)
    async with app.router.lifespan_context(app):
        hub = app.state.proxy.kv_events
        await until(lambda: hub.streams["d0"].usable())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            text = (await c.get("/metrics")).text
    assert 'prefixgate_kv_events_usable{deployment="d0"} 1.0' in text
    assert 'prefixgate_kv_events_resyncs_total{deployment="d0"}' in text
