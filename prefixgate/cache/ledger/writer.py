"""Ledger rows written by a background thread, many per transaction (issue 10, hot path).

:class:`BatchedLedger` is a :class:`~prefixgate.cache.ledger.store.Ledger` whose :meth:`~BatchedLedger.write`
only queues the row (no SQLite call, no lock on the event loop); a writer thread, woken when a
batch starts, gathers rows for :data:`BATCH_WINDOW_S` and inserts what has queued — up to
:data:`MAX_BATCH` rows — in ONE transaction (one WAL append and
fsync-less commit instead of one per request). Rows keep their order.

Never lose a row: :meth:`~BatchedLedger.flush` waits until every queued row is committed;
:meth:`~BatchedLedger.rows` flushes first (a reader sees every row written before it asked);
:meth:`~BatchedLedger.close` flushes, then stops the thread; the app's lifespan end flushes, and
an ``atexit`` hook flushes a ledger nobody closed. A failed transaction is retried
(:data:`RETRIES`, backoff) — a busy database (another ``--workers`` process holding the write
lock past ``busy_timeout``) delays rows, never drops them; only a batch failing every retry is
dropped, logged with its size. Hostile content never costs a batch (issue 34): values are cleaned
first (:mod:`prefixgate.cache.ledger.sanitize`), and a batch SQLite still refuses for a value
(:data:`_CONTENT_ERRORS`, not a busy or failing database) is bisected
(:mod:`prefixgate.cache.ledger.isolate`): only the rows refused alone are dropped, logged and
counted (``bad_rows_dropped``, in :meth:`~BatchedLedger.state`).

Several processes (``prefixgate serve --workers N``) share one ledger file: SQLite WAL mode
serialises their transactions (``busy_timeout`` 5 s), so ``prefixgate report`` reads one file.
"""

from __future__ import annotations

import atexit
import logging
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixgate.cache.ledger import announced_rows, rollup
from prefixgate.cache.ledger.isolate import commit_isolating
from prefixgate.cache.ledger.sanitize import clean_values
from prefixgate.cache.ledger.store import COLUMNS, Ledger, LedgerRow
from prefixgate.config.schema import LedgerSettings

log = logging.getLogger("prefixgate.ledger")

MAX_BATCH = 512
BATCH_WINDOW_S = 0.02
"""After the first row of a batch arrives, the writer waits this long for more (unless the batch
fills, a flush is asked for, or the ledger closes): one thread wake-up per window under load,
not one per request."""
RETRIES = 5


_CONTENT_ERRORS = (sqlite3.InterfaceError, sqlite3.IntegrityError, sqlite3.DataError,
                   sqlite3.ProgrammingError, ValueError, TypeError, OverflowError)
"""A value SQLite (or ``sqlite3``'s binding) refused: the row is isolated, not retried
(``UnicodeEncodeError`` is a ValueError)."""


def _is_fault(e: BaseException) -> bool:
    """A busy or failing database (retried, then the batch dropped), not a refused value."""
    return not isinstance(e, _CONTENT_ERRORS)


_INSERT = (f"INSERT INTO requests ({', '.join(COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in COLUMNS)})")


class BatchedLedger(Ledger):
    """SQLite ledger at ``path`` written by a background thread (module docstring).

    ``batches``: transactions committed so far; ``written``: rows committed. :meth:`write`
    returns 0 (the row id is not known yet)."""

    def __init__(self, path: str | Path, replica: str | None = None, *,
                 recover: bool = False) -> None:
        super().__init__(path, replica, recover=recover)
        self._queue: deque[LedgerRow] = deque()
        self._cv = threading.Condition()
        self._pending = 0
        self._flushing = 0
        self._stopping = False
        self.batches = 0
        self.written = 0
        self.bad_rows_dropped = 0
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda led: led.close() if led is not None else None)(ref()))

    def write(self, row: LedgerRow) -> int:
        """Queue ``row`` (written by the thread, in order); the row must not change after."""
        if not row.replica:
            row.replica = self.replica
        with self._cv:
            if self._stopping:
                raise RuntimeError("ledger closed")
            self._queue.append(row)
            self._pending += 1
            if len(self._queue) == 1 or len(self._queue) >= MAX_BATCH:
                self._cv.notify_all()  # wake the writer: a batch starts, or one is full
        return 0

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                self._cv.wait_for(lambda: len(self._queue) >= MAX_BATCH or self._stopping
                                  or self._flushing > 0, BATCH_WINDOW_S)
                batch = [self._queue.popleft()
                         for _ in range(min(MAX_BATCH, len(self._queue)))]
            self._commit(batch)
            with self._cv:
                self._pending -= len(batch)
                self._cv.notify_all()

    def _commit(self, batch: list[LedgerRow]) -> None:
        # the columns are scalars: read them off the rows (asdict / astuple deep-copy each
        # value, a third of this thread's time in issue 25's profile)
        values = [clean_values(COLUMNS, [getattr(r, c) for c in COLUMNS]) for r in batch]
        try:
            commit_isolating(values, self._transaction, _is_fault, self._bad_row)
        except Exception:
            log.exception("ledger batch of %d rows dropped after %d tries", len(batch), RETRIES)

    def _transaction(self, values: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``values`` (rows in :data:`COLUMNS` order) and fold their rollups, in one
        transaction; a fault (not a refused value) is retried :data:`RETRIES` times with
        backoff, then raised."""
        for attempt in range(RETRIES):
            try:
                with self._lock:
                    self._db.execute("BEGIN IMMEDIATE")
                    try:
                        self._db.executemany(_INSERT, values)
                        rollup.upsert_many(self._db, [dict(zip(COLUMNS, v)) for v in values])
                        self._db.execute("COMMIT")
                    except BaseException:
                        self._db.execute("ROLLBACK")
                        raise
                self.batches += 1
                self.written += len(values)
                return
            except Exception as e:
                if not _is_fault(e) or attempt == RETRIES - 1:
                    raise
                time.sleep(0.05 * 2 ** attempt)

    def _bad_row(self, values: tuple[Any, ...], e: BaseException) -> None:
        log.error("ledger row %s refused by SQLite for its content (%s); dropped, the rest of its "
                  "batch kept", values[COLUMNS.index("row_id")], type(e).__name__)
        self.bad_rows_dropped += 1

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every row queued so far is committed (or ``timeout_s`` passes), rows
        announced as answered for (:mod:`prefixgate.cache.ledger.announced_rows`) included."""
        self.announced.wait(announced_rows.WAIT_S if timeout_s is None else timeout_s)
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: self._pending == 0, timeout_s)
            finally:
                self._flushing -= 1

    def state(self) -> dict[str, Any]:
        """:meth:`Ledger.state` with the rows still queued in memory and the rows refused
        alone for their content."""
        return {**super().state(), "queued": self._pending,
                "bad_rows_dropped": self.bad_rows_dropped}

    def rows(self, since_ts: float = 0.0, trials: bool = False) -> list[dict[str, Any]]:
        """:meth:`Ledger.rows` after a :meth:`flush`."""
        self.flush()
        return super().rows(since_ts, trials)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """:meth:`Ledger.query` after a :meth:`flush`."""
        self.flush()
        return super().query(sql, params)

    def rollups(self, from_ts: float, to_ts: float,
                tenant: str | None = None) -> list[dict[str, Any]]:
        """:meth:`Ledger.rollups` after a :meth:`flush`."""
        self.flush()
        return super().rollups(from_ts, to_ts, tenant)

    def breaks(self, since_ts: float = 0.0, tenant: str | None = None) -> list[dict[str, Any]]:
        """:meth:`Ledger.breaks` after a :meth:`flush`."""
        self.flush()
        return super().breaks(since_ts, tenant)

    def close(self) -> None:
        """Flush, stop the writer thread, close the connection; a second call is a no-op."""
        with self._cv:
            if self._stopping:
                return
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()
        super().close()


def open_ledger(settings: LedgerSettings) -> Ledger:
    """The ledger a policy asks for, to serve with: PostgreSQL when ``url`` is set
    (:class:`prefixgate.cache.ledger.pg.PgLedger`, always batched), else the SQLite file at
    ``path``, batched (default) or one transaction per write — a file there that is not a usable
    ledger moved aside, a path that cannot be made degraded to memory (``recover``)."""
    if settings.url:
        try:
            from prefixgate.cache.ledger.pg import PgLedger  # psycopg only when asked for
        except ImportError as e:
            raise RuntimeError("ledger.url needs psycopg 3 and psycopg_pool: "
                               "pip install 'prefixgate[postgres]'") from e
        return PgLedger.from_settings(settings)
    if settings.batch_writes:
        return BatchedLedger(settings.path, settings.replica, recover=True)
    return Ledger(settings.path, settings.replica, recover=True)
