"""A ledger read waits for the rows the proxy has answered for but not yet written, except on
the thread that will write them (:mod:`prefixgate.cache.ledger.announced_rows`, issue 25)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from prefixgate.cache.ledger.announced_rows import AnnouncedRows
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.ledger.writer import BatchedLedger


def _announce_then_write(ledger: Ledger, delay_s: float) -> threading.Thread:
    ready = threading.Event()

    def writer() -> None:
        token = ledger.announced.announce()
        ready.set()
        time.sleep(delay_s)
        ledger.write(LedgerRow(model="late"))
        ledger.announced.settle(token)

    t = threading.Thread(target=writer)
    t.start()
    ready.wait()
    return t


def test_a_read_sees_a_row_announced_before_it_asked(tmp_path: Path) -> None:
    for ledger in (Ledger(tmp_path / "a.sqlite"), BatchedLedger(tmp_path / "b.sqlite")):
        t = _announce_then_write(ledger, 0.2)
        assert [r["model"] for r in ledger.rows()] == ["late"]
        t.join()
        ledger.close()


def test_the_announcing_thread_does_not_wait_for_its_own_rows() -> None:
    rows = AnnouncedRows()
    token = rows.announce()
    t0 = time.monotonic()
    assert rows.wait(timeout_s=2.0) is False and time.monotonic() - t0 < 0.5
    got: list[bool] = []
    other = threading.Thread(target=lambda: got.append(rows.wait(timeout_s=0.2)))
    other.start()
    other.join()
    assert got == [False]  # another thread waits, and times out while the row is pending
    rows.settle(token)
    assert rows.pending == 0 and rows.wait(timeout_s=0.1) is True


def test_settling_wakes_a_waiting_reader() -> None:
    rows = AnnouncedRows()
    tokens = [rows.announce(), rows.announce()]
    got: list[tuple[bool, float]] = []
    t0 = time.monotonic()
    reader = threading.Thread(target=lambda: got.append((rows.wait(5.0), time.monotonic() - t0)))
    reader.start()
    time.sleep(0.1)
    rows.settle(tokens[0])
    time.sleep(0.1)
    assert reader.is_alive()  # one row still pending
    rows.settle(tokens[1])
    reader.join()
    assert got[0][0] is True and got[0][1] < 2.0
