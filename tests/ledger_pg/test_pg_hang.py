"""A hung PostgreSQL loses nothing (issue 34, item 5): the database sits behind a loopback TCP
proxy the test controls (:class:`tests.faults.tcp_fault_proxy.TcpFaultProxy`), which at "hang"
keeps every connection open and forwards nothing — the kernel still acknowledges, so only a
client-side deadline notices. While it hangs the proxy serves, ``/healthz`` says the ledger is
down, the rows go to the spool once the writer's deadline passes, ``close()`` returns within its
bound, and when the database answers again every row is recorded exactly once.

The machine's server is never stopped; waits are deadlines against hanging, not timings."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.cache.ledger.spool import Spool
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.faults.tcp_fault_proxy import TcpFaultProxy, fault_proxy
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def until(cond: Callable[[], bool], deadline_s: float = 30.0) -> bool:
    """Poll ``cond`` until true or ``deadline_s`` passes (a guard against hanging)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def recorded(url: str) -> tuple[int, int]:
    """(rows, distinct row_ids) in ``url``'s ledger ((0, 0) before its first commit)."""
    with psycopg.connect(url) as c:
        try:
            got = c.execute("SELECT count(*), count(DISTINCT row_id) FROM requests").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0, 0
    assert got is not None
    return int(got[0]), int(got[1])


def via(url: str, proxy: TcpFaultProxy) -> str:
    """``url`` (a database on 127.0.0.1) reached through ``proxy``."""
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    return url.replace(host_port, f"127.0.0.1:{proxy.port}")


@pytest.fixture
def proxied(fresh_pg: str) -> Iterator[tuple[str, TcpFaultProxy]]:
    """(the fresh database's URL through a fault proxy, the proxy)."""
    port = int(fresh_pg.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    with fault_proxy("127.0.0.1", port) as proxy:
        yield via(fresh_pg, proxy), proxy


def drain(spool: Path, direct_url: str) -> None:
    """Empty ``spool`` into the database at ``direct_url`` (a later start of the proxy)."""
    led = PgLedger(direct_url, spool_path=spool, retry_s=0.05)
    assert until(lambda: led.state()["spooled_rows"] == 0)
    led.close()


def test_a_hang_is_reported_down_rows_spool_and_drain_once(proxied: tuple[str, TcpFaultProxy],
                                                           fresh_pg: str, tmp_path: Path) -> None:
    url, proxy = proxied
    led = PgLedger(url, spool_path=tmp_path / "spool.sqlite", retry_s=0.2)
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False}})
        with serve_app(build_app(policy, ledger=led, analyze=False)) as app_url, \
                httpx.Client(timeout=30) as c:
            def send(n: int) -> list[int]:
                return [c.post(app_url + "/v1/chat/completions", json=BODY).status_code
                        for _ in range(n)]

            def ledger_state() -> dict[str, object]:
                return c.get(app_url + "/healthz").json()["ledger"]  # type: ignore[no-any-return]

            assert send(5) == [200] * 5
            assert until(lambda: recorded(fresh_pg) == (5, 5))
            assert until(lambda: ledger_state()["up"] is True)
            proxy.set_mode("hang")
            assert send(8) == [200] * 8  # the proxy serves while its database hangs
            assert until(lambda: ledger_state()["up"] is False), "/healthz said up while hung"
            # acknowledged on disk: the writer's deadline passed, its batch went to the spool
            assert until(lambda: ledger_state()["queued"] == 0), "rows stuck in memory"
            st = ledger_state()
            assert st["spooled_rows"] == 8 and st["up"] is False and st["last_error"]
            assert c.get(app_url + "/healthz").status_code == 200  # informative, never a 503
            proxy.set_mode("pass")
            assert until(lambda: ledger_state()["spooled_rows"] == 0)
            assert until(lambda: ledger_state()["up"] is True)
    assert recorded(fresh_pg) == (13, 13)
    assert sum(r["data"]["requests"] for r in led.rollups(0, 4e9)) == 13
    led.close()


def test_close_during_a_hang_returns_and_loses_no_row(proxied: tuple[str, TcpFaultProxy],
                                                      fresh_pg: str, tmp_path: Path) -> None:
    """With its defaults, ``close()`` (what the process runs at exit after SIGTERM) returns
    while the database hangs, and every row is in PostgreSQL or the spool."""
    url, proxy = proxied
    spool = tmp_path / "spool.sqlite"
    led = PgLedger(url, spool_path=spool)
    led.write(LedgerRow(model="before"))
    led.flush(30)
    proxy.set_mode("hang")
    for i in range(30):
        led.write(LedgerRow(model=f"h{i}"))
    done = threading.Event()
    threading.Thread(target=lambda: (led.close(), done.set()), daemon=True).start()
    assert done.wait(60), "close() blocked on a hung database"
    proxy.set_mode("pass")
    drain(spool, fresh_pg)
    assert recorded(fresh_pg) == (31, 31)


def test_a_writer_stuck_past_close_bound_has_its_rows_spooled_by_close(
        proxied: tuple[str, TcpFaultProxy], fresh_pg: str, tmp_path: Path) -> None:
    """The writer's own deadline set longer than close's bound: close() takes the batch in
    flight and the queue itself, spools them, and cuts the writer loose; sent twice at worst,
    recorded once."""
    url, proxy = proxied
    spool = tmp_path / "spool.sqlite"
    led = PgLedger(url, spool_path=spool, write_timeout_s=120)
    led.write(LedgerRow(model="before"))
    led.flush(30)
    proxy.set_mode("hang")
    for i in range(20):
        led.write(LedgerRow(model=f"h{i}"))
    assert until(lambda: led.state()["up"] is False)  # stalled past STALL_S: reported down
    assert led.state()["queued"] == 20
    done = threading.Event()
    threading.Thread(target=lambda: (led.close(timeout_s=0.5), done.set()), daemon=True).start()
    assert done.wait(60)
    sp = Spool(spool, 1000)
    assert sp.size() == 20
    sp.close()
    proxy.set_mode("pass")
    drain(spool, fresh_pg)
    assert recorded(fresh_pg) == (21, 21)


def test_a_read_during_a_hang_fails_instead_of_blocking_its_thread(
        proxied: tuple[str, TcpFaultProxy], tmp_path: Path) -> None:
    """``/api/savings`` reads in a worker thread: before, a read on a hung database blocked that
    thread for good (the pool's check on checkout had no deadline), and enough of them would
    have taken every worker thread of the proxy. Now it raises (the pool's timeout)."""
    url, proxy = proxied
    led = PgLedger(url, spool_path=tmp_path / "spool.sqlite")
    led.write(LedgerRow(model="a"))
    assert len(led.rows()) == 1  # a pooled reader connection is open and idle
    proxy.set_mode("hang")
    outcome: list[str] = []

    def read() -> None:
        try:
            led.rows()
            outcome.append("rows")
        except Exception as e:  # PoolTimeout / OperationalError: the database is unreachable
            outcome.append(type(e).__name__)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a read blocked its thread on a hung database"
    assert outcome and outcome != ["rows"]
    proxy.set_mode("pass")
    assert until(lambda: _read_ok(led))
    led.close()


def _read_ok(led: PgLedger) -> bool:
    try:
        return len(led.rows()) == 1
    except Exception:
        return False


def test_api_savings_says_503_while_the_database_hangs(proxied: tuple[str, TcpFaultProxy],
                                                       tmp_path: Path) -> None:
    """The dashboard's read during a hang: a 503 with ``retry-after`` in OpenAI's error shape
    (before: the request never returned)."""
    url, proxy = proxied
    led = PgLedger(url, spool_path=tmp_path / "spool.sqlite")
    policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                              "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "e"}]})
    with serve_app(build_app(policy, ledger=led, analyze=False)) as app_url:
        led.write(LedgerRow(model="a"))
        assert httpx.get(app_url + "/api/savings", timeout=30).status_code == 200
        proxy.set_mode("hang")
        try:
            r = httpx.get(app_url + "/api/savings", timeout=60)
        except httpx.ReadTimeout:
            pytest.fail("/api/savings never answered while the database hung")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "ledger_unavailable"
        proxy.set_mode("pass")
    led.close()
