"""PostgreSQL down: the proxy keeps serving, rows wait in the bounded on-disk spool, the gauge
and ``/healthz`` say so, and the spool drains — each row once — when the database returns.

Outages are a closed port (nothing listens) or a private cluster stopped and started with
``pg_ctl`` (:class:`tests.ledger_pg.pg_servers.PrivateCluster`); the machine's shared server is
never stopped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.cache.ledger.spool import Spool
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.ledger_pg.pg_servers import PrivateCluster, create_db, free_port
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app


def _until(cond: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _distinct(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as c:
        got = c.execute("SELECT count(*), count(DISTINCT row_id) FROM requests").fetchone()
    assert got is not None
    return int(got[0]), int(got[1])


def test_the_spool_keeps_order_and_refuses_past_its_bound(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.sqlite", max_rows=5)
    assert sp.put([("row", {"i": i}) for i in range(3)]) == 0
    assert sp.put([("row", {"i": i}) for i in range(3, 8)]) == 3  # room for 2 of 5
    assert sp.size() == 5 and sp.dropped == 3
    got = sp.peek(10)
    assert [p["i"] for _, _, p in got] == [0, 1, 2, 3, 4]
    sp.remove([s for s, _, _ in got[:2]])
    assert [p["i"] for _, _, p in sp.peek(10)] == [2, 3, 4]
    sp.close()
    again = Spool(tmp_path / "s.sqlite", max_rows=5)  # on disk: a restart finds them
    assert again.size() == 3
    again.close()


def test_rows_spool_while_the_database_is_down_and_drain_once_when_it_returns(
        private_pg: PrivateCluster, tmp_path: Path) -> None:
    url = create_db(private_pg.url)
    led = PgLedger(url, spool_path=tmp_path / "spool.sqlite", retry_s=0.2)
    for i in range(50):
        led.write(LedgerRow(model=f"before{i}"))
    led.flush()
    assert led.state()["up"] and _distinct(url) == (50, 50)
    private_pg.stop()
    try:
        for i in range(30):
            led.write(LedgerRow(model=f"during{i}"))
        led.flush(30)  # acknowledged: in the spool, on disk
        st = led.state()
        assert st["up"] is False and st["spooled_rows"] == 30 and st["queued"] == 0
        for i in range(10):
            led.write(LedgerRow(model=f"late{i}"))
        led.flush(30)
        assert led.state()["spooled_rows"] == 40
    finally:
        private_pg.start()
    assert _until(lambda: led.state()["spooled_rows"] == 0)
    assert led.state()["up"] is True
    assert _distinct(url) == (90, 90)
    models = [r["model"] for r in led.rows()]
    assert models[50:] == [f"during{i}" for i in range(30)] + [f"late{i}" for i in range(10)]
    led.close()


def test_a_spool_drained_twice_records_each_row_once(private_pg: PrivateCluster,
                                                      tmp_path: Path) -> None:
    url = create_db(private_pg.url)
    spool = tmp_path / "shared-spool.sqlite"
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    down = PgLedger(dead, spool_path=spool, retry_s=60)
    for i in range(25):
        down.write(LedgerRow(model=f"m{i}"))
    down.flush(30)
    down.close()
    copy = tmp_path / "copy-spool.sqlite"  # as if a worker died after its commit, before removing
    copy.write_bytes(spool.read_bytes())
    for p in (spool, copy):
        led = PgLedger(url, spool_path=p, retry_s=0.1)
        assert _until(lambda: led.state()["spooled_rows"] == 0)
        led.close()
    assert _distinct(url) == (25, 25)


def test_requests_are_served_while_postgres_is_down_and_healthz_says_so(tmp_path: Path) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    led = PgLedger(dead, spool_path=tmp_path / "spool.sqlite", spool_max_rows=3, retry_s=60)
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False}})
        with serve_app(build_app(policy, ledger=led, analyze=False)) as url:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            codes = [httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code
                     for _ in range(5)]
            assert codes == [200] * 5
            led.flush(30)
            h = httpx.get(url + "/healthz").json()
            assert h["status"] == "ok"  # the ledger alone never takes the proxy out
            assert h["ledger"]["kind"] == "postgresql" and h["ledger"]["up"] is False
            assert h["ledger"]["spooled_rows"] == 3 and h["ledger"]["spool_dropped"] == 2
            m = httpx.get(url + "/metrics").text
            assert "prefixgate_ledger_up 0.0" in m
            assert "prefixgate_ledger_spooled_rows 3.0" in m
            assert "prefixgate_ledger_spool_dropped_rows 2.0" in m
    led.close()


def test_new_rows_queue_behind_what_the_spool_still_holds(fresh_pg: str, tmp_path: Path) -> None:
    spool = tmp_path / "left-over.sqlite"
    dead = PgLedger(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", spool_path=spool,
                    retry_s=60)
    for i in range(5):
        dead.write(LedgerRow(model=f"old{i}"))
    dead.close()  # an earlier run's rows, left in the spool
    led = PgLedger(fresh_pg, spool_path=spool, retry_s=60)
    assert led.state()["spooled_rows"] == 5
    led.write(LedgerRow(model="new"))
    led.flush(30)
    assert _until(lambda: led.state()["spooled_rows"] == 0)
    assert [r["model"] for r in led.rows()] == [f"old{i}" for i in range(5)] + ["new"]
    led.close()
