"""The savings ledger in PostgreSQL: one record for many replicas (issue 26).

:class:`PgLedger` keeps the :class:`~prefixgate.cache.ledger.store.Ledger` interface — the same rows,
rollups and queries as the SQLite ledger (the readers' SQL is SQLite-style ``?``; it is run here
with ``%s``, :func:`pg_sql`) — so ``report``, ``/api/savings`` and the dashboard read every
replica's traffic from one database, and split it by the ``replica`` column.

Writing, off the event loop: :meth:`PgLedger.write` only queues the row (no socket, no lock
held while waiting on the database). A writer thread commits what has queued — up to
:data:`MAX_BATCH` rows — at least every ``flush_interval_s`` (the timer), at once when a batch
fills or a :meth:`~PgLedger.flush` is asked for (the app's shutdown, which uvicorn runs on
SIGTERM, asks for one), in ONE transaction: the rows ``INSERT ... ON CONFLICT (row_id) DO
NOTHING RETURNING row_id``, and only the rows that were new folded into their minutes' rollups
(keys locked in sorted order, so replicas folding the same minute neither deadlock nor double
count). ``row_id`` is chosen by the proxy when the row is made, so a batch sent again after a lost
acknowledgement, or drained twice from the spool, is recorded once.

Acknowledged = committed in PostgreSQL, or stored in the on-disk spool. A replica killed with
SIGKILL loses only the rows still queued in memory (at most one timer window of traffic); one
stopped with SIGTERM flushes them first and loses none.

PostgreSQL unreachable: requests are still served. A batch that cannot be committed (connection
refused or lost, a timeout) goes to the bounded spool (:mod:`prefixgate.cache.ledger.spool`,
``ledger.spool_path``, at most ``ledger.spool_max_rows`` rows); while the spool holds anything,
new rows join it behind the older ones, the database is tried again every :data:`RETRY_S`, and
once it answers the spool drains oldest first. :meth:`PgLedger.state` says which
(``/healthz``'s ``ledger`` object, the ``prefixgate_ledger_*`` gauges). A batch the database
refuses for its content (not a connection fault) is dropped and logged with its size, as the
SQLite writer drops a batch that failed every retry.

The writer keeps one connection of its own; readers take connections from a
``psycopg_pool.ConnectionPool`` (checked on checkout, so a restarted server costs no failed
read). Both are synchronous: the readers already run in worker threads (``/api/savings``) or in
the ``report`` command, and the writer is a thread like the SQLite one. The schema is applied at
the writer's first connection (:mod:`prefixgate.cache.ledger.pg_schema`).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from prefixgate.cache.ledger import announced_rows, rollup
from prefixgate.cache.ledger.pg_schema import migrate, missing_columns
from prefixgate.cache.ledger.spool import Item, Spool
from prefixgate.cache.ledger.store import COLUMNS, Ledger, LedgerRow, default_replica
from prefixgate.config.schema import LedgerSettings

log = logging.getLogger("prefixgate.ledger")

MAX_BATCH = 512
"""Rows per transaction at most (512 x 40 columns stays under PostgreSQL's 65,535 parameters)."""
RETRY_S = 1.0
"""While the database is unreachable, seconds between attempts (rows spool meanwhile)."""
CONNECT_TIMEOUT_S = 2
STATEMENT_TIMEOUT_MS = 10_000
READ_TIMEOUT_S = 5.0
"""A reader waits this long for a pooled connection, then raises ``psycopg_pool.PoolTimeout``."""
ACK_SAMPLES = 65_536
_DOWN = (psycopg.OperationalError, psycopg.InterfaceError)
"""Errors that mean "the database is not reachable now" (spool and retry), not "bad row"."""
_ROW_COLUMNS = ["id", *COLUMNS]


def pg_sql(sql: str) -> str:
    """A SQLite-style statement (``?`` placeholders) as psycopg's (``%s``; a literal ``%``
    doubled). The readers' statements hold no ``?`` inside string literals."""
    return sql.replace("%", "%%").replace("?", "%s")


class _QmarkConnection:
    """A psycopg connection that takes SQLite-style statements, so the SQLite ledger's readers
    (:func:`prefixgate.cache.ledger.rollup.read`) run unchanged."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self._conn.execute(pg_sql(sql), tuple(params))  # type: ignore[arg-type]


def row_values(d: dict[str, Any]) -> list[Any]:
    """A row's column values in :data:`COLUMNS` order, bools as 0/1 (the columns are BIGINT,
    as SQLite stores them)."""
    return [int(v) if isinstance(v, bool) else v for v in (d.get(c) for c in COLUMNS)]


def insert_items(conn: psycopg.Connection[Any], items: Sequence[Item]) -> int:
    """Commit ``items`` (rows and break records) in one transaction on ``conn``: rows
    ``ON CONFLICT (row_id) DO NOTHING``, the new ones folded into the rollups, breaks likewise
    by ``break_id``. Return how many rows were new (the rest were already recorded)."""
    rows = [p for k, p in items if k == "row"]
    brks = [p for k, p in items if k == "break"]
    with conn.transaction():
        new: set[str] = set()
        if rows:
            one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
            sql = (f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES "
                   f"{', '.join([one] * len(rows))} ON CONFLICT (row_id) DO NOTHING RETURNING row_id")
            flat = [v for r in rows for v in row_values(r)]
            new = {r[0] for r in conn.execute(sql, flat).fetchall()}  # type: ignore[arg-type]
            fold_rollups(conn, [r for r in rows if r["row_id"] in new])
        if brks:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO breaks (break_id, ts, session, record, tenant) "
                                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (break_id) DO NOTHING",
                                [(b["break_id"], b["ts"], b["session"], b["record"], b["tenant"])
                                 for b in brks])
    return len(new)


def rollup_key(row: dict[str, Any]) -> tuple[int, str, str, str, str]:
    """(minute, route, model, backend, tenant) of a row, as :func:`prefixgate.cache.ledger.rollup.upsert`
    keys it."""
    return (int(row["ts"]) // 60 * 60, row.get("route") or "", row.get("model") or "",
            row.get("backend") or "", row.get("tenant") or "")


def fold_rollups(conn: psycopg.Connection[Any], rows: Sequence[dict[str, Any]]) -> None:
    """Fold ``rows`` into their minutes' rollups (inside the caller's transaction): the batch's
    sums per key merged in Python first, then per key, in sorted order, the rollup row created
    if missing, locked (``FOR UPDATE``), merged and written back."""
    sums: dict[tuple[int, str, str, str, str], dict[str, Any]] = {}
    for r in rows:
        rollup.merge(sums.setdefault(rollup_key(r), {}), rollup.fold(r))
    table = rollup.TABLE
    for key in sorted(sums):
        conn.execute(f"INSERT INTO {table} (minute, route, model, backend, tenant, data) "
                     "VALUES (%s, %s, %s, %s, %s, '{}') ON CONFLICT DO NOTHING", key)
        got = conn.execute(f"SELECT data FROM {table} WHERE minute=%s AND route=%s AND model=%s "
                           "AND backend=%s AND tenant=%s FOR UPDATE", key).fetchone()
        data = rollup.merge(json.loads(got[0]) if got else {}, sums[key])
        conn.execute(f"UPDATE {table} SET data=%s WHERE minute=%s AND route=%s AND model=%s "
                     "AND backend=%s AND tenant=%s",
                     (json.dumps(data, separators=(",", ":")), *key))


class PgLedger(Ledger):
    """The ledger in the PostgreSQL database at ``url`` (module docstring), spooling to
    ``spool_path`` (at most ``spool_max_rows`` rows) while it is unreachable.

    Subclasses :class:`~prefixgate.cache.ledger.store.Ledger` for its interface only: every public
    method is overridden and no SQLite file is opened. ``written``: rows the database
    recorded as new; ``batches``: transactions committed; :meth:`write` returns 0."""

    kind = "postgresql"

    def __init__(self, url: str, *, replica: str | None = None,
                 spool_path: str = "~/.cache/prefixgate/ledger-spool.sqlite",
                 spool_max_rows: int = 100_000, flush_interval_s: float = 0.02,
                 retry_s: float = RETRY_S) -> None:
        self.url = url
        self.path = url.split("@")[-1]  # host:port/db, never a password
        self.announced = announced_rows.AnnouncedRows()  # rows answered for, not yet queued
        self.replica = replica or default_replica()
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self.spool = Spool(spool_path, spool_max_rows)
        self._spooled = self.spool.size()  # rows left by an earlier run drain first
        self._queue: deque[tuple[tuple[str, Any], float]] = deque()  # (kind, row | dict), t0
        self._cv = threading.Condition()
        self._lock = threading.Lock()
        self._pending = 0
        self._flushing = 0
        self._stopping = False
        self._closed = False
        self._conn: psycopg.Connection[Any] | None = None
        self._up = False
        self._tried_at = -1e9
        self.last_error = ""
        self.batches = 0
        self.written = 0
        self.ack_ms: deque[float] = deque(maxlen=ACK_SAMPLES)
        """Milliseconds from :meth:`write` to acknowledgement (database or spool), newest last."""
        self._pool = ConnectionPool(url, min_size=0, max_size=4, open=False, name="ledger-read",
                                    check=ConnectionPool.check_connection,
                                    kwargs=self._conn_kwargs())
        self._pool.open(wait=False)
        self._thread = threading.Thread(target=self._run, name="ledger-pg-writer", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda led: led.close() if led is not None else None)(ref()))

    @classmethod
    def from_settings(cls, settings: LedgerSettings) -> PgLedger:
        """The ledger of a policy's ``ledger:`` section (``url`` set)."""
        assert settings.url is not None
        return cls(settings.url, replica=settings.replica, spool_path=settings.spool_path,
                   spool_max_rows=settings.spool_max_rows,
                   flush_interval_s=settings.flush_interval_s)

    @staticmethod
    def _conn_kwargs() -> dict[str, Any]:
        return {"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S,
                "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"}

    # -- writing ------------------------------------------------------------------------------

    def write(self, row: LedgerRow) -> int:
        """Queue ``row`` (the writer commits it, in order); the row must not change after.
        Raises RuntimeError once the ledger is closed."""
        if not row.replica:
            row.replica = self.replica
        self._enqueue(("row", row))  # made a dict by the writer thread, not on the caller's
        return 0

    def write_break(self, session: str, record: dict[str, Any], tenant: str = "") -> None:
        """Queue one cache-break record (as :meth:`Ledger.write_break`; never blocks)."""
        self._enqueue(("break", {"break_id": uuid.uuid4().hex, "ts": time.time(),
                                 "session": session, "record": json.dumps(record),
                                 "tenant": tenant}))

    def _enqueue(self, item: tuple[str, Any]) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("ledger closed")
            self._queue.append((item, time.monotonic()))
            self._pending += 1
            if len(self._queue) == 1 or len(self._queue) >= MAX_BATCH:
                self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._stopping,
                                  self.retry_s if self._spooled else None)
                if self._queue:
                    self._cv.wait_for(lambda: len(self._queue) >= MAX_BATCH or self._stopping
                                      or self._flushing > 0, self.flush_interval_s)
                batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
                last = self._stopping and not self._queue
            try:
                if batch:
                    self._deliver([(k, asdict(p) if isinstance(p, LedgerRow) else p)
                                   for (k, p), _ in batch])
                    now = time.monotonic()
                    self.ack_ms.extend((now - t0) * 1000.0 for _, t0 in batch)
                self._drain()
            except Exception:
                log.exception("ledger writer: %d rows lost", len(batch))
            finally:
                with self._cv:
                    self._pending -= len(batch)
                    self._cv.notify_all()
            if last:
                return

    def _deliver(self, items: list[Item]) -> None:
        """To the database when it is up and nothing older waits in the spool; else to the
        spool."""
        if not self._spooled and self._may_try():
            try:
                self._commit(items)
                return
            except _DOWN as e:
                self._mark_down(e)
            except psycopg.Error:
                log.exception("ledger batch of %d rows refused by PostgreSQL; dropped", len(items))
                return
        self._spool(items)

    def _spool(self, items: list[Item]) -> None:
        refused = self.spool.put(items)
        self._spooled = self.spool.size()
        if refused:
            log.error("ledger spool full (%d rows): %d rows dropped", self.spool.max_rows, refused)

    def _drain(self) -> None:
        """Move spooled rows to the database, oldest first, while it answers (a bounded number
        of batches per call, so new rows are not kept waiting)."""
        for _ in range(64):
            if not self._spooled or not self._may_try():
                return
            got = self.spool.peek(MAX_BATCH)
            if not got:
                self._spooled = 0
                return
            try:
                self._commit([(k, p) for _, k, p in got])
            except _DOWN as e:
                self._mark_down(e)
                return
            except psycopg.Error:
                log.exception("spooled ledger batch of %d rows refused by PostgreSQL; dropped",
                              len(got))
            self.spool.remove([s for s, _, _ in got])
            self._spooled = self.spool.size()
            if not self._spooled:
                log.warning("ledger spool drained: PostgreSQL has every row again")

    def _may_try(self) -> bool:
        return self._up or time.monotonic() - self._tried_at >= self.retry_s

    def _mark_down(self, e: BaseException) -> None:
        if self._up or not self.last_error:
            log.warning("ledger: PostgreSQL unreachable (%s); rows go to the spool %s",
                        type(e).__name__, self.spool.path)
        self._up = False
        self.last_error = type(e).__name__
        self._tried_at = time.monotonic()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def _commit(self, items: list[Item]) -> None:
        if self._conn is None or self._conn.closed:
            self._tried_at = time.monotonic()
            conn = psycopg.connect(self.url, **self._conn_kwargs())
            migrate(conn)
            missing = missing_columns(conn)
            if missing:
                conn.close()
                raise psycopg.OperationalError(
                    f"ledger table lacks columns {missing}: a migration is missing")
            self._conn = conn
        with self._lock:
            self.written += insert_items(self._conn, items)
            self.batches += 1
        self._up, self.last_error = True, ""

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every row queued so far is acknowledged — committed, or spooled while
        the database is down — or ``timeout_s`` passes; rows announced as answered for
        (:mod:`prefixgate.cache.ledger.announced_rows`) are waited for first."""
        self.announced.wait(announced_rows.WAIT_S if timeout_s is None else timeout_s)
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                self._cv.wait_for(lambda: self._pending == 0, timeout_s)
            finally:
                self._flushing -= 1

    def state(self) -> dict[str, Any]:
        """``{"kind": "postgresql", "up", "spooled_rows", "spool_dropped", "queued",
        "spool_max_rows", "last_error"}``: ``up`` is False from a failed attempt until one
        succeeds (False too before the first commit has been tried); figures are the writer's
        own, read without touching the database."""
        return {"kind": self.kind, "up": self._up, "spooled_rows": self._spooled,
                "spool_dropped": self.spool.dropped, "queued": self._pending,
                "spool_max_rows": self.spool.max_rows, "last_error": self.last_error}

    # -- reading ------------------------------------------------------------------------------

    def _read(self, fn: Any) -> Any:
        self.flush(READ_TIMEOUT_S)  # read-your-writes while the database is up
        with self._pool.connection(timeout=READ_TIMEOUT_S) as conn:
            return fn(_QmarkConnection(conn))

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only SQLite-style ``sql`` (``?`` placeholders) against the database.
        Raises ``psycopg_pool.PoolTimeout`` / ``psycopg.OperationalError`` while it is down."""
        return [tuple(r) for r in self._read(lambda db: db.execute(sql, params).fetchall())]

    def rollups(self, from_ts: float, to_ts: float,
                tenant: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`Ledger.rollups` (:func:`prefixgate.cache.ledger.rollup.read`, every replica's)."""
        return list(self._read(lambda db: rollup.read(db, from_ts, to_ts, tenant)))

    def rows(self, since_ts: float = 0.0) -> list[dict[str, Any]]:
        """As :meth:`Ledger.rows`: every replica's rows with ``ts >= since_ts``, in commit
        order (``id``)."""
        got = self._read(lambda db: db.execute(
            f"SELECT {', '.join(_ROW_COLUMNS)} FROM requests WHERE ts >= ? ORDER BY id",
            (since_ts,)).fetchall())
        return [dict(zip(_ROW_COLUMNS, r)) for r in got]

    def breaks(self, since_ts: float = 0.0, tenant: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`Ledger.breaks`."""
        where, params = rollup.tenant_filter(tenant)
        got = self._read(lambda db: db.execute(
            f"SELECT record FROM breaks WHERE ts >= ?{where} ORDER BY id",
            (since_ts, *params)).fetchall())
        return [json.loads(r[0]) for r in got]

    def close(self) -> None:
        """Flush (to the database or the spool), stop the writer, close the connections and the
        spool; a second call is a no-op."""
        with self._cv:
            if self._stopping:
                return
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()
        if self._conn is not None:
            self._conn.close()
        self._pool.close()
        self.spool.close()
