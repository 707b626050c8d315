"""``/healthz`` says degraded (503 + reasons) when the upstream pool is nearly used up or the
event loop lags, and ok again once it is not; the resource gauges are on ``/metrics``
(issue 8, "Resource accounting")."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.observe.health import LAG_DEGRADED_S, LoopLagMonitor, health_reasons
from tests.faults.conftest import STALL_S, FaultRig
from tests.faults.fault_server import FaultServer, serve_faults
from tests.servers import serve_app

POOL = 4


def _wait(pred: Any, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while not pred() and time.monotonic() < end:
        time.sleep(0.02)
    return bool(pred())


def test_healthz_degraded_while_the_pool_is_used_up_and_ok_after(tmp_path: Path) -> None:
    """A pool of 4 and 4 streams held open by a silent upstream: 503 naming the responses in
    use; a 5th request waits for a connection: named too (its client gives up: the queued
    request is abandoned); all clients gone: 200 ok, and one row per request."""
    up = FaultServer(stall_s=STALL_S)
    with serve_faults(up) as up_url:
        policy = parse_policy({
            "backends": {"oa": {"kind": "openai_compat", "base_url": up_url + "/v1",
                                "timeout_s": STALL_S}},
            "routes": [{"match": "*", "backend": "oa"}],
            "ledger": {"path": str(tmp_path / "l.sqlite")}})
        ledger = Ledger(policy.ledger.path)
        app = build_app(policy, ledger=ledger, rewrite_fn=None, analyze=False)
        app.state.proxy.upstream.max_connections = POOL
        with serve_app(app) as url:
            assert httpx.get(url + "/healthz").json()["status"] == "ok"
            body = {"model": "stall-after", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}
            with httpx.Client(timeout=30) as client:
                streams = [client.stream("POST", url + "/v1/chat/completions", json=body)
                           for _ in range(POOL)]
                for s in streams:
                    assert s.__enter__().status_code == 200
                r = httpx.get(url + "/healthz")
                assert r.status_code == 503 and r.json()["status"] == "degraded"
                assert any(f"in use: {POOL} of a pool of {POOL}" in x for x in r.json()["reasons"])

                async def fifth() -> None:  # waits for a pool connection, then gives up
                    async with httpx.AsyncClient(timeout=2.0) as c:
                        with pytest.raises(httpx.ReadTimeout):
                            await c.post(url + "/v1/chat/completions", json=body)

                def queued() -> bool:
                    return any("waiting" in x for x in httpx.get(url + "/healthz").json()[
                        "reasons"])

                t = threading.Thread(target=asyncio.run, args=(fifth(),))
                t.start()
                assert _wait(queued)
                t.join()
                for s in streams:
                    s.__exit__(None, None, None)
            assert _wait(lambda: httpx.get(url + "/healthz").status_code == 200)
            assert httpx.get(url + "/healthz").json() == {"status": "ok", "reasons": [],
                                                          "backends": ["oa"], "down": {}}
        rows = sorted((r["status"], r["http_status"]) for r in ledger.rows())
        assert rows == [("client_disconnect", 200)] * POOL + [("client_disconnect", 499)]


def test_resource_gauges_are_exported(faults: FaultRig) -> None:
    for name, labels in [("prefixgate_upstream_responses_in_use", ""),
                         ("prefixgate_upstream_pool_connections", 'state="active"'),
                         ("prefixgate_upstream_pool_connections", 'state="idle"'),
                         ("prefixgate_upstream_pool_queued", ""),
                         ("prefixgate_event_loop_lag_seconds", "")]:
        assert faults.gauge(name, labels) >= 0


async def test_loop_lag_monitor_sees_a_blocked_loop() -> None:
    """Blocking the loop for 0.3 s shows as at least 0.2 s of lag in the next sample."""
    mon = LoopLagMonitor(interval_s=0.01)
    mon.start()
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # the loop is blocked: no sample can run
    await asyncio.sleep(0.05)
    await mon.stop()
    assert mon.recent_max_s >= 0.2
    assert mon._task is None


def test_health_reasons_name_each_threshold() -> None:
    assert health_reasons(0, 512, 0, 0.0) == []
    assert health_reasons(460, 512, 0, 0.0) == []
    (pool,) = health_reasons(461, 512, 0, 0.0)
    assert "461 of a pool of 512" in pool
    (queued,) = health_reasons(0, 512, 3, 0.0)
    assert "waiting" in queued and "3" in queued
    (lag,) = health_reasons(0, 512, 0, LAG_DEGRADED_S)
    assert "lag" in lag
    assert len(health_reasons(512, 512, 1, 2.0)) == 3
