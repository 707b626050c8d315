"""The batched ledger writer: rows queued off the caller's thread, committed many per
transaction, in order, and never lost — on close, on the app's shutdown, across processes."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.ledger.writer import BatchedLedger, open_ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import LedgerSettings
from prefixgate.proxy.app import build_app
from tests.cache.hang_guard import hang_guard  # noqa: F401  (autouse: a hung writer fails fast)
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app


def test_rows_are_committed_in_batches_and_in_order(tmp_path: Path) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite")
    with led._lock:  # the writer thread is held: everything written now queues behind it
        for i in range(200):
            led.write(LedgerRow(model=f"m{i}", tenant="t"))
    rows = led.rows()  # flushes first
    assert [r["model"] for r in rows] == [f"m{i}" for i in range(200)]
    assert led.written == 200 and led.batches <= 2
    led.close()


def test_batched_rows_are_folded_into_the_minute_rollups(tmp_path: Path) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite")
    t0 = 1_800_000_000.0
    for i in range(150):
        led.write(LedgerRow(ts=t0 + i, model="m", prompt_tokens=100 + i, cached_tokens=i,
                            status="ok" if i % 10 else "upstream_error"))
    rolled = led.rollups(t0, t0 + 3600)  # flushes first
    assert sum(r["data"]["requests"] for r in rolled) == 150
    assert sum(r["data"]["prompt_tokens"] for r in rolled) == sum(100 + i for i in range(150))
    assert sum(r["data"]["errors"] for r in rolled) == 15
    assert {r["minute"] for r in rolled} == {int(t0 + i) // 60 * 60 for i in range(150)}
    led.close()


def test_close_flushes_every_queued_row(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    led = BatchedLedger(path)
    led._lock.acquire()
    threading.Timer(0.2, led._lock.release).start()  # the writer is busy while rows queue
    for i in range(500):
        led.write(LedgerRow(model=f"m{i}"))
    assert led.written < 500
    led.close()
    assert len(Ledger(path).rows()) == 500


def test_writes_from_many_threads_all_land(tmp_path: Path) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite")

    def writer(k: int) -> None:
        for i in range(100):
            led.write(LedgerRow(model=f"{k}-{i}"))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r["model"] for r in led.rows()}) == 800
    led.close()


def test_policy_picks_batched_or_direct(tmp_path: Path) -> None:
    a = open_ledger(LedgerSettings(path=str(tmp_path / "a.sqlite")))
    b = open_ledger(LedgerSettings(path=str(tmp_path / "b.sqlite"), batch_writes=False))
    assert isinstance(a, BatchedLedger) and not isinstance(b, BatchedLedger)
    a.close()
    b.close()


def test_app_shutdown_flushes_the_rows_of_its_requests(tmp_path: Path) -> None:
    """The default app ledger is batched; stopping the server leaves every row on disk."""
    up = ScriptedUpstream(script=Script(body=completion()))
    path = tmp_path / "l.sqlite"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with serve_app(up.app()) as up_url:
        policy = parse_policy({
            "backends": {"e": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
            "routes": [{"match": "*", "backend": "e"}], "ledger": {"path": str(path)}})
        app = build_app(policy, rewrite_fn=None, analyze=False)
        assert isinstance(app.state.proxy.ledger, BatchedLedger)
        with serve_app(app) as url, httpx.Client(timeout=30) as c:
            for _ in range(30):
                assert c.post(url + "/v1/chat/completions", json=body).status_code == 200
    rows = Ledger(path).rows()
    assert len(rows) == 30 and {r["status"] for r in rows} == {"ok"}
