"""The bounded on-disk spool of a PostgreSQL ledger (issue 26): where rows wait while the
database is unreachable, so the proxy keeps serving and nothing acknowledged is lost.

One SQLite file (``ledger.spool_path``), table ``spool (seq INTEGER PRIMARY KEY, kind TEXT,
item TEXT)``: ``kind`` is ``row`` (a ledger row as a JSON object of its columns) or ``break`` (a
cache-break record ``{"ts", "session", "record", "tenant"}``). A :meth:`Spool.put` is one
transaction, so a row is either wholly in the spool or not at all; a process killed after it
returns keeps the row (WAL, ``synchronous=NORMAL``: safe against a killed process, not against a
power cut).

The bound: at most ``max_rows`` items (default 100,000 — about 100 MB of ~1 KB rows, about
28 minutes of traffic at 60 requests/s). Items past it are not stored: :meth:`put` returns how
many it refused and :attr:`Spool.dropped` counts them, so the gauge shows the loss; the rows
already spooled, the oldest, are kept (they are the ones a report is missing longest).

Draining (:meth:`peek` oldest first, then :meth:`remove` once PostgreSQL committed them) is
idempotent: rows carry their ``row_id`` and the database inserts ``ON CONFLICT DO NOTHING``, so a
process killed between the commit and the remove sends them again and nothing is doubled.
Several ``--workers`` processes may share one spool file (SQLite serialises their writes).

A spool that cannot be used never stops the proxy (issue 34,
:mod:`prefixgate.cache.ledger.local_file`): a file that is not a spool (not SQLite, a damaged page,
another schema) is moved aside — renamed ``<name>.corrupt-<UTC time>-<pid>``, logged with the new
name so its rows can still be read by hand — and a new spool is made in its place; a path that
cannot be created or opened (a parent that is a file, no permission, a read-only disk) degrades
to a spool in memory, with the same bound, logged as an error and named in :attr:`Spool.error`
(``/healthz``'s ``ledger.spool_error``): rows of an outage then survive as long as the process,
not a restart. An item that no longer decodes
is removed when met and counted in :attr:`Spool.undecodable`, so one bad item cannot stop the
drain behind it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixgate.cache.ledger.local_file import NotOurs, open_or_recover

log = logging.getLogger("prefixgate.ledger")

Item = tuple[str, dict[str, Any]]
"""(kind, payload): ``("row", {column: value})`` or ``("break", {...})``."""
KINDS = ("row", "break")
_COLUMNS = ["seq", "kind", "item"]


class Spool:
    """The spool file at ``path`` (``~`` expanded, parent made; ``":memory:"`` for tests),
    holding at most ``max_rows`` items. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | Path, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError("spool max_rows must be at least 1")
        self.max_rows = max_rows
        self.dropped = 0
        self.undecodable = 0
        self.error = ""
        """Why the spool is in memory instead of at the path asked for ("" when it is not;
        the error's kind and message, never the path)."""
        self.moved_aside: str | None = None
        """Where an unusable file found at the path was moved (None: none was)."""
        self._lock = threading.Lock()
        opened = open_or_recover(str(path), self._connect, "ledger spool")
        self.path, self._db = opened.path, opened.db
        self.moved_aside, self.error = opened.moved_aside, opened.error

    @staticmethod
    def _connect(p: str) -> sqlite3.Connection:
        db = sqlite3.connect(p, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY, "
                       "kind TEXT NOT NULL, item TEXT NOT NULL)")
            have = [r[1] for r in db.execute("PRAGMA table_info(spool)")]
            if have != _COLUMNS:
                raise NotOurs(f"its spool table has columns {have}, not {_COLUMNS}")
            db.execute("SELECT count(*), max(seq) FROM spool").fetchone()  # reads the pages
        except BaseException:
            db.close()
            raise
        return db

    def put(self, items: Sequence[Item]) -> int:
        """Store ``items`` in order, in one transaction, up to the bound; return how many were
        refused (0 when all fit)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                room = max(0, self.max_rows - self._count())
                kept = items[:room]
                self._db.executemany("INSERT INTO spool (kind, item) VALUES (?, ?)",
                                     [(k, json.dumps(v, separators=(",", ":"))) for k, v in kept])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        refused = len(items) - len(kept)
        self.dropped += refused
        return refused

    def peek(self, limit: int) -> list[tuple[int, str, dict[str, Any]]]:
        """The ``limit`` oldest items as ``(seq, kind, payload)``, oldest first (not removed).
        An item that no longer decodes (not JSON, not a known kind) is deleted here and
        counted in :attr:`undecodable`, so the items behind it still drain."""
        with self._lock:
            got = self._db.execute("SELECT seq, kind, item FROM spool ORDER BY seq LIMIT ?",
                                   (limit,)).fetchall()
        out: list[tuple[int, str, dict[str, Any]]] = []
        bad: list[int] = []
        for s, k, v in got:
            try:
                payload = json.loads(v)
                if k not in KINDS or not isinstance(payload, dict):
                    raise ValueError(f"kind {k!r}")
            except (ValueError, TypeError):
                bad.append(int(s))
                continue
            out.append((int(s), str(k), payload))
        if bad:
            self.remove(bad)
            self.undecodable += len(bad)
            log.error("ledger spool %s: %d items that no longer decode removed", self.path,
                      len(bad))
        return out

    def remove(self, seqs: Sequence[int]) -> None:
        """Delete the items ``seqs`` (after PostgreSQL committed them)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM spool WHERE seq = ?", [(s,) for s in seqs])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def size(self) -> int:
        """Items waiting now."""
        with self._lock:
            return self._count()

    def _count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        """Close the file (its items stay for the next start)."""
        with self._lock:
            self._db.close()

