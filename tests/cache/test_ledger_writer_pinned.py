"""The batched ledger writer pinned point by point (issue 21): :mod:`prefixgate.cache.ledger.writer`.

Source: its module docstring — rows queued by ``write`` and committed by the writer thread,
woken when a batch starts, up to ``MAX_BATCH`` rows per transaction, in order; ``flush`` waits
for every queued row; the readers flush first; ``close`` flushes then stops; a failed
transaction is rolled back and retried (``RETRIES``, backoff), only a batch failing every
retry is dropped (logged). The database is wrapped so a test can fail or slow a statement; the
original never depends on timing (each test's waits are for the writer, never a duration).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger import writer as lw
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.ledger.writer import BatchedLedger
from tests.cache.hang_guard import hang_guard  # noqa: F401  (autouse: a hung writer fails fast)


class DB:
    """A sqlite3 connection whose statements can be made to fail or wait."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.fail_many = 0  # executemany calls left to fail
        self.fail_upsert = 0  # rollup upserts left to fail
        self.slow_s = 0.0
        self.statements: list[str] = []

    def execute(self, sql: str, *a: Any) -> Any:
        self.statements.append(sql.split()[0])
        if sql.startswith("INSERT OR REPLACE INTO rollup_minutes") and self.fail_upsert:
            self.fail_upsert -= 1
            raise RuntimeError("upsert failed")
        return self.real.execute(sql, *a)

    def executemany(self, sql: str, rows: Any) -> Any:
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.fail_many:
            self.fail_many -= 1
            raise RuntimeError("busy")
        return self.real.executemany(sql, rows)

    def close(self) -> None:
        self.real.close()


@pytest.fixture
def led(tmp_path: Path) -> Any:
    led = BatchedLedger(tmp_path / "l.sqlite")
    led._db = DB(led._db)  # type: ignore[assignment]
    yield led
    led.close()


def wait_until(cond: Any) -> bool:
    """Wait for the writer thread (bounded so a hung writer fails the test, not the suite)."""
    for _ in range(2000):
        if cond():
            return True
        time.sleep(0.005)
    return False


def test_one_write_wakes_the_writer(led: Any) -> None:
    """Nobody flushes: the writer, woken by the first row of a batch, commits it on its own."""
    led.write(LedgerRow(model="m"))
    assert wait_until(lambda: led.written == 1)
    assert led.batches == 1


def test_a_full_batch_is_committed_and_batches_hold_at_most_max_batch(led: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_BATCH 2: 5 rows queued while the writer is held -> batches of 2, 2, 1, in order."""
    monkeypatch.setattr(lw, "MAX_BATCH", 2)
    with led._cv:  # the writer cannot take rows while we hold its lock
        for i in range(5):
            led.write(LedgerRow(model=f"m{i}"))
    led.flush()
    assert (led.batches, led.written) == (3, 5)
    assert [r["model"] for r in led.rows()] == [f"m{i}" for i in range(5)]


def test_flush_leaves_no_count_behind(led: Any) -> None:
    for i in range(3):
        led.write(LedgerRow(model=f"m{i}"))
    led.flush()
    assert (led._pending, led._flushing, led.written) == (0, 0, 3)
    led._db.slow_s = 1.0
    led.write(LedgerRow(model="slow"))
    led.flush(timeout_s=0.01)  # gave up waiting: still no flush counted as in progress
    assert led._flushing == 0 and led.written == 3  # it returned before the slow row landed
    led.flush()
    assert led._pending == 0 and led.written == 4


@pytest.mark.parametrize("read", ["rows", "query", "rollups", "breaks"])
def test_every_reader_flushes_first(led: Any, read: str) -> None:
    """A reader sees every row written before it asked (the writer made slow, 0.2 s)."""
    led._db.slow_s = 0.2
    led.write(LedgerRow(ts=100.0, model="m", prompt_tokens=7))
    got = {"rows": lambda: led.rows(),
           "query": lambda: led.query("SELECT model FROM requests"),
           "rollups": lambda: led.rollups(0, 1000),
           "breaks": lambda: led.breaks()}[read]()
    assert led.written == 1
    if read == "rows":
        assert [r["model"] for r in got] == ["m"]
    if read == "query":
        assert got == [("m",)]
    if read == "rollups":
        assert got[0]["data"]["prompt_tokens"] == 7


def test_a_failed_transaction_is_retried_and_lands_once(led: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(lw.time, "sleep", slept.append)
    led._db.fail_many = 2
    led.write(LedgerRow(model="m"))
    led.flush()
    assert led.written == 1 and led.batches == 1 and len(led.rows()) == 1
    assert slept == [0.05, 0.1]  # 0.05 * 2^attempt


def test_a_batch_failing_every_retry_is_dropped_and_logged(led: Any, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    slept: list[float] = []
    monkeypatch.setattr(lw.time, "sleep", slept.append)
    led._db.fail_many = lw.RETRIES
    with caplog.at_level(logging.ERROR, logger="prefixgate.ledger"):
        led.write(LedgerRow(model="lost"))
        led.flush()
    assert led.written == 0 and led.batches == 0 and led._pending == 0
    assert len(slept) == lw.RETRIES - 1
    assert [r.getMessage() for r in caplog.records] == ["ledger batch of 1 rows dropped after 5 tries"]
    led._db.fail_many = 0
    led.write(LedgerRow(model="next"))  # the writer goes on
    led.flush()
    assert [r["model"] for r in led.rows()] == ["next"]


def test_close_flushes_refuses_later_writes_and_is_idempotent(tmp_path: Path) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite")
    with led._cv:
        for i in range(3):
            led.write(LedgerRow(model=f"m{i}"))
    led.close()
    assert led.written == 3 and not led._thread.is_alive()
    with pytest.raises(RuntimeError, match="^ledger closed$"):
        led.write(LedgerRow(model="late"))
    led.close()


def test_write_returns_zero_and_many_threads_keep_each_ones_order(led: Any) -> None:
    assert led.write(LedgerRow(model="x")) == 0

    def writer(k: int) -> None:
        for i in range(50):
            led.write(LedgerRow(model=f"{k}:{i}"))

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    models = [r["model"] for r in led.rows()][1:]
    assert len(models) == 200
    for k in range(4):
        assert [m for m in models if m.startswith(f"{k}:")] == [f"{k}:{i}" for i in range(50)]


def test_rows_gather_for_the_window_and_a_full_batch_goes_at_once(led: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long window (60 s): one row waits in it (not committed alone); a second row fills a
    batch of MAX_BATCH 2, which is committed at once, both rows in one transaction."""
    monkeypatch.setattr(lw, "BATCH_WINDOW_S", 60.0)
    monkeypatch.setattr(lw, "MAX_BATCH", 2)
    led.write(LedgerRow(model="m0"))
    time.sleep(0.2)
    assert led.written == 0  # still gathering
    led.write(LedgerRow(model="m1"))
    assert wait_until(lambda: led.written == 2)
    assert led.batches == 1


def test_a_flush_or_a_close_cuts_the_window_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lw, "BATCH_WINDOW_S", 60.0)
    led = BatchedLedger(tmp_path / "l.sqlite")
    led.write(LedgerRow(model="m0"))
    done = threading.Event()
    threading.Thread(target=lambda: (led.flush(), done.set()), daemon=True).start()
    assert wait_until(done.is_set) and led.written == 1
    led.write(LedgerRow(model="m1"))
    closed = threading.Event()
    threading.Thread(target=lambda: (led.close(), closed.set()), daemon=True).start()
    assert wait_until(closed.is_set) and led.written == 2


def test_flush_waits_for_rows_announced_as_answered(led: Any) -> None:
    """The proxy answered a request whose row is still being filled: a flush (a reader) waits
    until that row is settled, then for the writer."""
    token = led.announced.announce()  # this thread's token; the flush runs on another
    done = threading.Event()
    threading.Thread(target=lambda: (led.flush(), done.set()), daemon=True).start()
    time.sleep(0.2)
    assert not done.is_set()
    led.write(LedgerRow(model="late"))
    led.announced.settle(token)
    assert wait_until(done.is_set) and led.written == 1
    t0 = time.monotonic()
    other = threading.Thread(target=led.announced.announce)
    other.start()
    other.join()  # a row announced by a thread that never settles it: a flush waits its timeout only
    led.flush(timeout_s=0.05)
    assert time.monotonic() - t0 < lw.announced_rows.WAIT_S


def test_state_counts_the_rows_still_queued(led: Any) -> None:
    with led._cv:
        for i in range(3):
            led.write(LedgerRow(model=f"m{i}"))
        assert led.state()["queued"] == 3
    led.flush()
    assert led.state()["queued"] == 0


def test_a_row_takes_the_ledgers_replica_unless_it_names_its_own(tmp_path: Path) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite", replica="p1")
    led.write(LedgerRow(model="a"))
    led.write(LedgerRow(model="b", replica="p9"))
    assert [(r["model"], r["replica"]) for r in led.rows()] == [("a", "p1"), ("b", "p9")]
    led.close()


def test_the_readers_pass_their_arguments_on(led: Any) -> None:
    led.write(LedgerRow(ts=100.0, model="old", prompt_tokens=1, tenant="t1"))
    led.write(LedgerRow(ts=200.0, model="new", prompt_tokens=2, tenant="t2"))
    led.write_break("s", {"region": "r"}, "t2")
    assert [r["model"] for r in led.rows(150.0)] == ["new"]
    assert led.query("SELECT model FROM requests WHERE ts > ?", (150.0,)) == [("new",)]
    assert [r["data"]["prompt_tokens"] for r in led.rollups(0, 1000, "t2")] == [2]
    assert [r["data"]["prompt_tokens"] for r in led.rollups(150, 1000)] == [2]
    assert led.breaks(0.0, "t1") == [] and led.breaks(0.0, "t2") == [{"region": "r"}]
    assert led.breaks(time.time() + 60) == []


def test_open_ledger_picks_the_kind_the_policy_asks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixgate.config.schema import LedgerSettings

    batched = lw.open_ledger(LedgerSettings(path=str(tmp_path / "a.sqlite"), replica="r1"))
    assert type(batched) is BatchedLedger and batched.replica == "r1"
    batched.close()
    plain = lw.open_ledger(LedgerSettings(path=str(tmp_path / "b.sqlite"), batch_writes=False, replica="r2"))
    assert type(plain) is lw.Ledger and plain.replica == "r2" and plain.path == str(tmp_path / "b.sqlite")
    plain.close()
    from prefixgate.cache.ledger import pg as ledger_pg

    pg = LedgerSettings(path=str(tmp_path / "c.sqlite"), url="postgresql://127.0.0.1:1/x", replica="r3")
    monkeypatch.setattr(ledger_pg.PgLedger, "from_settings", classmethod(lambda cls, st: ("pg", st)))
    assert lw.open_ledger(pg) == ("pg", pg)  # the url wins over path / batch_writes
    monkeypatch.setitem(__import__("sys").modules, "prefixgate.cache.ledger.pg", None)  # psycopg missing
    with pytest.raises(RuntimeError, match=r"ledger.url needs psycopg 3 and psycopg_pool: "
                                           r"pip install 'prefixgate\[postgres\]'"):
        lw.open_ledger(LedgerSettings(path=str(tmp_path / "c.sqlite"), url="postgresql://127.0.0.1/x"))


def test_a_ledger_nobody_closed_is_closed_at_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hooks: list[Any] = []
    monkeypatch.setattr(lw.atexit, "register", hooks.append)
    led = BatchedLedger(tmp_path / "l.sqlite")
    with led._cv:
        led.write(LedgerRow(model="m"))
    hooks[0]()
    assert led.written == 1 and not led._thread.is_alive()
    gone = BatchedLedger(tmp_path / "g.sqlite")
    gone.close()
    del gone
    import gc
    gc.collect()
    hooks[1]()  # the ledger is gone: nothing to close, no error


def test_a_flush_waits_for_announced_rows_at_most_wait_s(led: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row announced and never settled (a bug elsewhere) delays a reader by WAIT_S, never forever."""
    monkeypatch.setattr(lw.announced_rows, "WAIT_S", 0.1)
    hold = threading.Event()  # the announcing thread stays alive (a thread id can be reused)
    other = threading.Thread(target=lambda: (led.announced.announce(), hold.wait()))
    other.start()
    assert wait_until(lambda: led.announced.pending == 1)
    done = threading.Event()
    threading.Thread(target=lambda: (led.flush(), done.set()), daemon=True).start()
    assert wait_until(done.is_set)
    hold.set()
    other.join()


def test_readers_start_at_time_zero_by_default(led: Any) -> None:
    led.write(LedgerRow(ts=0.5, model="early"))
    led._db.execute("INSERT INTO breaks (ts, session, record, tenant) VALUES (0.5, 's', '{\"region\": \"r\"}', '')")
    assert [r["model"] for r in led.rows()] == ["early"]
    assert led.breaks() == [{"region": "r"}]


def test_flushes_at_once_leave_no_count_behind(led: Any) -> None:
    """Two readers flushing at the same time: each counts itself in and out."""
    led._db.slow_s = 0.3
    led.write(LedgerRow(model="m"))
    ts = [threading.Thread(target=led.flush) for _ in range(2)]
    for t in ts:
        t.start()
    assert wait_until(lambda: led._flushing == 2)
    for t in ts:
        t.join()
    assert led._flushing == 0 and led.written == 1


def test_a_process_that_never_closed_its_ledger_exits_with_its_rows_written(tmp_path: Path) -> None:
    """The writer is a daemon thread named ``ledger-writer`` (as thread dumps show it): the
    interpreter does not wait for it, and the atexit hook commits what was queued."""
    import subprocess
    import sys

    from tests.paths import REPO

    path = tmp_path / "l.sqlite"
    code = ("from prefixgate.cache.ledger.writer import BatchedLedger\n"
            "from prefixgate.cache.ledger.store import LedgerRow\n"
            "import threading\n"
            f"led = BatchedLedger({str(path)!r})\n"
            "with led._cv:\n"
            "    led.write(LedgerRow(model='queued'))\n"
            "print([(t.name, t.daemon) for t in threading.enumerate() if t is led._thread])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('ledger-writer', True)]"
    led = BatchedLedger(path)
    assert [r["model"] for r in led.rows()] == ["queued"]
    led.close()
