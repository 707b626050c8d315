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
SIGKILL loses only the rows still queued in memory. A writer round with the database (a
connect, bounded by :data:`CONNECT_TIMEOUT_S`, then the calls, by ``write_timeout_s``) lasts at
most ``R = CONNECT_TIMEOUT_S + write_timeout_s``, and a row waits at most for the round in
progress and its own: at most the rows of the last ``flush_interval_s + 2R`` are lost — one timer
window while the database answers promptly; from the moment it stops answering,
``flush_interval_s + R`` (the round that hangs ends at its deadline, and the rows queued behind
it go straight to the spool). One
stopped with SIGTERM flushes them first and loses none: :meth:`PgLedger.close` waits at most
:attr:`PgLedger.shutdown_s` for the writer, then spools what it still holds itself.

A hung database (issue 34): each round of the writer (its batch, then the spool's drain) runs
under one client-side deadline, ``write_timeout_s`` (from the round's start, or from a connect
made in it): the connect is bounded by ``connect_timeout`` and every call on the connection by
:mod:`prefixgate.cache.ledger.watchdog`,
which cuts the socket (libpq keepalives and ``tcp_user_timeout`` catch a silent peer host too).
Past it the batch goes to the spool like any outage's, and ``state()["up"]`` is False as soon as a
call has been waiting :data:`STALL_S`, so ``/healthz`` says so while it hangs, not only after.

PostgreSQL unreachable: requests are still served. A batch that cannot be committed (connection
refused or lost, a timeout) goes to the bounded spool (:mod:`prefixgate.cache.ledger.spool`,
``ledger.spool_path``, at most ``ledger.spool_max_rows`` rows); while the spool holds anything,
new rows join it behind the older ones, the database is tried again every :data:`RETRY_S`, and
once it answers the spool drains oldest first. :meth:`PgLedger.state` says which
(``/healthz``'s ``ledger`` object, the ``prefixgate_ledger_*`` gauges).

Hostile content (issue 34): every row is cleaned before it is spooled or sent
(:mod:`prefixgate.cache.ledger.sanitize`: NUL, lone surrogates, 64-bit range, bounded lengths), and
a batch the database still refuses for its content is bisected
(:mod:`prefixgate.cache.ledger.isolate`): only the rows that fail alone are dropped, each logged by
its ``row_id`` and counted (``bad_rows_dropped``), never the batch around them. Content and fault
are told apart by the error's SQLSTATE class (:func:`is_fault`), not its Python type: a row too
big for an index (54000) is content even though psycopg files it under ``OperationalError``.

The writer keeps one connection of its own; readers take connections from a
``psycopg_pool.ConnectionPool`` (checked on checkout, so a restarted server costs no failed
read). Both are synchronous: the readers already run in worker threads (``/api/savings``) or in
the ``report`` command, and the writer is a thread like the SQLite one. The schema is applied at
the writer's first connection (:mod:`prefixgate.cache.ledger.pg_schema`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from prefixgate.cache.ledger import announced_rows, rollup
from prefixgate.cache.ledger.isolate import commit_isolating
from prefixgate.cache.ledger.pg_schema import migrate, missing_columns
from prefixgate.cache.ledger.sanitize import clean_row
from prefixgate.cache.ledger.spool import Item, Spool
from prefixgate.cache.ledger.store import (
    CLIENT_ROWS,
    COLUMNS,
    Ledger,
    LedgerRow,
    LedgerUnavailable,
    default_replica,
)
from prefixgate.cache.ledger.watchdog import Watchdog
from prefixgate.config.schema import LedgerSettings

log = logging.getLogger("prefixgate.ledger")

MAX_BATCH = 512
"""Rows per transaction at most (512 x 40 columns stays under PostgreSQL's 65,535 parameters)."""
RETRY_S = 1.0
"""While the database is unreachable, seconds between attempts (rows spool meanwhile)."""
CONNECT_TIMEOUT_S = 2
"""Seconds a connection attempt may take, handshake included (psycopg enforces it)."""
STATEMENT_TIMEOUT_MS = 10_000
WRITE_TIMEOUT_S = 5.0
"""Default client-side deadline of one call of the writer on its connection (a batch's
transaction, the migrations): past it the watchdog cuts the connection and the batch spools."""
STALL_S = 2.0
"""A writer call waiting longer than this makes ``state()["up"]`` False (``/healthz``)."""
READ_TIMEOUT_S = 5.0
"""A reader waits this long for a pooled connection, then raises ``psycopg_pool.PoolTimeout``."""
READ_QUERY_TIMEOUT_S = 30.0
"""Client-side deadline of one read on a pooled connection (the watchdog cuts it past this)."""
CHECK_TIMEOUT_S = 2.0
"""Client-side deadline of the pool's check of a connection on checkout."""
ACK_SAMPLES = 65_536
_DOWN = (psycopg.OperationalError, psycopg.InterfaceError)
"""Client-side errors that mean "the database is not reachable now" (spool and retry)."""
CONTENT_SQLSTATE_CLASSES = ("22", "23", "54")
"""SQLSTATE classes the server gives a row's *content*: data exception (a NUL byte, a number
out of range), integrity violation, program limit exceeded (an index entry too large: psycopg
files it under OperationalError, which made one such row look like an outage and stay at the head
of the spool forever). Any other server error (a dropped table, a restart, a lock or statement
timeout, a full disk) is a fault: the rows wait in the spool until it is fixed."""


def is_fault(e: BaseException) -> bool:
    """True when ``e`` means "retry the whole batch later" (spool it), False when it is the
    batch's content (isolate the row): a server error by its SQLSTATE class
    (:data:`CONTENT_SQLSTATE_CLASSES`), a client-side psycopg error by its type (connection
    and timeout errors are faults), and anything else (an encoding or type error of a value on
    our side) is content."""
    if not isinstance(e, psycopg.Error):
        return False
    state = getattr(e, "sqlstate", None)
    if state:
        return state[:2] not in CONTENT_SQLSTATE_CLASSES
    return isinstance(e, _DOWN)
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
        if rollup.counted(r):  # a meaning-guard trial send is never a saving (issue 36)
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
                 retry_s: float = RETRY_S, write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.url = url
        self.path = url.split("@")[-1]  # host:port/db, never a password
        self.announced = announced_rows.AnnouncedRows()  # rows answered for, not yet queued
        self.replica = replica or default_replica()
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self.write_timeout_s = write_timeout_s
        self.shutdown_s = write_timeout_s + CONNECT_TIMEOUT_S + 1.0
        """Longest :meth:`close` waits for the writer before spooling what it holds itself."""
        self.spool = Spool(spool_path, spool_max_rows)
        self._spooled = self.spool.size()  # rows left by an earlier run drain first
        self._queue: deque[tuple[tuple[str, Any], float]] = deque()  # (kind, row | dict), t0
        self._inflight: list[tuple[tuple[str, Any], float]] = []  # taken from the queue, unacked
        self._busy_since: float | None = None  # a call on the writer's connection started then
        self._round_ends = 0.0  # the writer's current round must end by then (monotonic)
        self._watch = Watchdog()
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
        self.bad_rows_dropped = 0
        """Rows the database refused alone for their content (logged by ``row_id``)."""
        self.ack_ms: deque[float] = deque(maxlen=ACK_SAMPLES)
        """Milliseconds from :meth:`write` to acknowledgement (database or spool), newest last."""
        self._pool = ConnectionPool(url, min_size=0, max_size=4, open=False, name="ledger-read",
                                    check=self._check_read_connection,
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
                   flush_interval_s=settings.flush_interval_s,
                   write_timeout_s=settings.write_timeout_s)

    def _conn_kwargs(self) -> dict[str, Any]:
        """libpq options of every connection: autocommit, the connect and statement timeouts,
        TCP keepalives (a silent peer found in ~11 s) and ``tcp_user_timeout`` (data left
        unacknowledged this long ends the connection), both under the watchdog's deadline."""
        return {"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S,
                "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                "keepalives_count": 3, "tcp_user_timeout": int(self.write_timeout_s * 1000)}

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
                self._inflight = batch
                last = self._stopping and not self._queue
            # one deadline for this round's calls (the batch, then the spool's drain): rows
            # queued meanwhile wait at most write_timeout_s for the writer to come back
            self._round_ends = time.monotonic() + self.write_timeout_s
            try:
                if batch:
                    self._deliver(_items(batch), batch)
                    now = time.monotonic()
                    self.ack_ms.extend((now - t0) * 1000.0 for _, t0 in batch)
            except Exception:
                log.exception("ledger writer: %d rows lost", len(batch))
            finally:
                with self._cv:
                    if self._inflight is batch:  # else close() spooled it itself
                        self._pending -= len(batch)
                        self._inflight = []
                    self._cv.notify_all()
            try:
                self._drain()
            except Exception:
                log.exception("ledger writer: the spool's drain failed; retried later")
            if last:
                return

    def _deliver(self, items: list[Item], batch: object) -> None:
        """To the database when it is up and nothing older waits in the spool; else to the
        spool (unless :meth:`close` took ``batch``, the queue entries of ``items``, and spooled
        them itself)."""
        if not self._spooled and self._may_try():
            try:
                self._commit_isolating(items)
                return
            except psycopg.Error as e:  # a fault (content errors are isolated inside)
                self._mark_down(e)
        with self._cv:
            if self._inflight is not batch:
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
            if not self._spooled or not self._may_try() or self._left_s() <= 0:
                return
            got = self.spool.peek(MAX_BATCH)
            if not got:
                self._spooled = 0
                return
            try:
                self._commit_isolating([(k, clean_row(p)) for _, k, p in got])
            except psycopg.Error as e:  # a fault (content errors are isolated inside)
                self._mark_down(e)
                return
            self.spool.remove([s for s, _, _ in got])
            self._spooled = self.spool.size()
            if not self._spooled:
                log.warning("ledger spool drained: PostgreSQL has every row again")

    def _may_try(self) -> bool:
        return self._up or time.monotonic() - self._tried_at >= self.retry_s

    def _mark_down(self, e: BaseException) -> None:
        why = (f"write timeout ({self.write_timeout_s:g} s)" if getattr(e, "timed_out", False)
               else type(e).__name__)
        if self._up or not self.last_error:
            log.warning("ledger: PostgreSQL unreachable (%s); rows go to the spool %s",
                        why, self.spool.path)
        self._up = False
        self.last_error = why
        self._tried_at = time.monotonic()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def _commit_isolating(self, items: list[Item]) -> None:
        """Commit ``items``, bisecting a batch refused for its content so that only the rows
        refused alone are dropped (:mod:`prefixgate.cache.ledger.isolate`); a fault raises."""
        def bad(item: Item, e: BaseException) -> None:
            kind, payload = item
            log.error("ledger %s %s refused by PostgreSQL for its content (%s); dropped, the "
                      "rest of its batch kept", kind,
                      payload.get("row_id") or payload.get("break_id"), type(e).__name__)
            self.bad_rows_dropped += 1
        commit_isolating(items, self._commit, is_fault, bad)

    def _left_s(self) -> float:
        """Seconds left of this round's deadline (``write_timeout_s`` from its start, or from
        the connection made in it: a connect has its own bound, :data:`CONNECT_TIMEOUT_S`)."""
        return self._round_ends - time.monotonic()

    def _commit(self, items: Sequence[Item]) -> None:
        if self._left_s() <= 0:
            raise psycopg.OperationalError("the writer's round has no time left")
        if self._conn is None or self._conn.closed:
            self._tried_at = time.monotonic()
            conn = psycopg.connect(self.url, **self._conn_kwargs())
            # the calls get their full deadline after a connect (bounded on its own): a slow
            # but working server is reached again, never refused for the connect's time
            self._round_ends = max(self._round_ends, time.monotonic() + self.write_timeout_s)
            try:
                with self._deadline(conn):
                    migrate(conn)
                    missing = missing_columns(conn)
            except BaseException:
                conn.close()
                raise
            if missing:
                conn.close()
                raise psycopg.OperationalError(
                    f"ledger table lacks columns {missing}: a migration is missing")
            self._conn = conn
        with self._lock, self._deadline(self._conn):
            self.written += insert_items(self._conn, items)
            self.batches += 1
        self._up, self.last_error = True, ""

    @contextlib.contextmanager
    def _deadline(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Run the block under the writer's client-side deadline on ``conn`` (what is left of
        the round's ``write_timeout_s``): past it the watchdog cuts the socket and the error
        raised in the block is marked ``timed_out`` (the log and ``last_error`` say "write
        timeout")."""
        self._busy_since = time.monotonic()
        try:
            with self._watch.guard(conn.fileno(), max(0.0, self._left_s())) as g:
                try:
                    yield
                except BaseException as e:
                    if g.fired:
                        e.timed_out = True  # type: ignore[attr-defined]
                    raise
        finally:
            self._busy_since = None

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
        "spool_max_rows", "last_error", "bad_rows_dropped", "spool", "spool_error"}``:
        ``up`` is False from a failed attempt until one succeeds (False too before the first
        commit has been tried), and while a call on the writer's connection has been waiting
        longer than :data:`STALL_S` (``last_error`` then says since when); ``spool`` is "disk"
        or "memory" (the path could not be used) and ``spool_error`` says why ("" on disk).
        Figures are the writer's own, read without touching the database."""
        up, err = self._up, self.last_error
        since = self._busy_since
        waited = time.monotonic() - since if since is not None else 0.0
        if waited > STALL_S:
            up, err = False, f"no answer for {waited:.0f} s"
        return {"kind": self.kind, "up": up, "spooled_rows": self._spooled,
                "spool_dropped": self.spool.dropped, "queued": self._pending,
                "spool_max_rows": self.spool.max_rows, "last_error": err,
                "bad_rows_dropped": self.bad_rows_dropped,
                "spool": "memory" if self.spool.path == ":memory:" else "disk",
                "spool_error": self.spool.error}

    # -- reading ------------------------------------------------------------------------------

    def _check_read_connection(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check on checkout (an empty statement), under the watchdog: a hung server
        fails the check in :data:`CHECK_TIMEOUT_S` and the pool tries another connection,
        instead of the reader (a worker thread of ``/api/savings``) blocking forever."""
        with self._watch.guard(conn.fileno(), CHECK_TIMEOUT_S):
            ConnectionPool.check_connection(conn)

    def _read(self, fn: Any) -> Any:
        self.flush(READ_TIMEOUT_S)  # read-your-writes while the database is up
        try:
            with self._pool.connection(timeout=READ_TIMEOUT_S) as conn, \
                    self._watch.guard(conn.fileno(), READ_QUERY_TIMEOUT_S):
                return fn(_QmarkConnection(conn))
        except psycopg.Error as e:
            if is_fault(e):
                raise LedgerUnavailable(f"the ledger's database cannot be read now "
                                        f"({type(e).__name__})") from e
            raise

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only SQLite-style ``sql`` (``?`` placeholders) against the database.
        Raises :class:`~prefixgate.cache.ledger.store.LedgerUnavailable` while it is down or
        hung (every reader does)."""
        return [tuple(r) for r in self._read(lambda db: db.execute(sql, params).fetchall())]

    def rollups(self, from_ts: float, to_ts: float,
                tenant: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`Ledger.rollups` (:func:`prefixgate.cache.ledger.rollup.read`, every replica's)."""
        return list(self._read(lambda db: rollup.read(db, from_ts, to_ts, tenant)))

    def rows(self, since_ts: float = 0.0, trials: bool = False) -> list[dict[str, Any]]:
        """As :meth:`Ledger.rows`: every replica's rows with ``ts >= since_ts``, in commit
        order (``id``); trial rows only with ``trials``."""
        where = "" if trials else f" AND {CLIENT_ROWS}"
        got = self._read(lambda db: db.execute(
            f"SELECT {', '.join(_ROW_COLUMNS)} FROM requests WHERE ts >= ?{where} ORDER BY id",
            (since_ts,)).fetchall())
        return [dict(zip(_ROW_COLUMNS, r)) for r in got]

    def breaks(self, since_ts: float = 0.0, tenant: str | None = None) -> list[dict[str, Any]]:
        """As :meth:`Ledger.breaks`."""
        where, params = rollup.tenant_filter(tenant)
        got = self._read(lambda db: db.execute(
            f"SELECT record FROM breaks WHERE ts >= ?{where} ORDER BY id",
            (since_ts, *params)).fetchall())
        return [json.loads(r[0]) for r in got]

    def close(self, timeout_s: float | None = None) -> None:
        """Flush (to the database or the spool), stop the writer, close the connections and the
        spool; a second call is a no-op. Bounded: when the writer has not finished within
        ``timeout_s`` (default :attr:`shutdown_s`), the rows it still holds — its batch in
        flight and the queue — are spooled here (sent twice at worst, recorded once: ``row_id``)
        and its connection is cut; the connections are then left to the process's exit."""
        with self._cv:
            if self._stopping:
                return
            self._stopping = True
            self._cv.notify_all()
        bound = self.shutdown_s if timeout_s is None else timeout_s
        self._thread.join(bound)
        if self._thread.is_alive():
            self._spool_left_behind(bound)
            return
        self._watch.stop()
        if self._conn is not None:
            self._conn.close()
        self._pool.close()
        self.spool.close()

    def _spool_left_behind(self, waited_s: float) -> None:
        """close()'s way out of a writer that is stuck: take its unacknowledged rows, spool
        them from this thread, cut its connection."""
        with self._cv:
            left = self._inflight + list(self._queue)
            self._inflight, self._queue = [], deque()
            self._pending = 0
            self._cv.notify_all()
        try:
            refused = self.spool.put(_items(left)) if left else 0
            log.error("ledger: the writer did not finish within %g s; %d rows spooled by the "
                      "shutdown instead (%d refused by a full spool)", waited_s, len(left),
                      refused)
        except Exception:
            log.exception("ledger: the writer did not finish; %d rows lost", len(left))
        self._watch.cut_all()


def _items(batch: Sequence[tuple[tuple[str, Any], float]]) -> list[Item]:
    """Queued ``((kind, row | dict), t0)`` entries as cleaned spool / insert items."""
    return [(k, clean_row(asdict(p) if isinstance(p, LedgerRow) else dict(p)))
            for (k, p), _ in batch]
