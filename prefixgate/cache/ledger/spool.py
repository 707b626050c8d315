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
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Item = tuple[str, dict[str, Any]]
"""(kind, payload): ``("row", {column: value})`` or ``("break", {...})``."""


class Spool:
    """The spool file at ``path`` (``~`` expanded, parent made; ``":memory:"`` for tests),
    holding at most ``max_rows`` items. Thread-safe (one connection, one lock)."""

    def __init__(self, path: str | Path, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError("spool max_rows must be at least 1")
        p = str(path)
        if p != ":memory:":
            fp = Path(p).expanduser()
            fp.parent.mkdir(parents=True, exist_ok=True)
            p = str(fp)
        self.path = p
        self.max_rows = max_rows
        self.dropped = 0
        self._lock = threading.Lock()
        self._db = sqlite3.connect(p, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY, "
                         "kind TEXT NOT NULL, item TEXT NOT NULL)")

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
        """The ``limit`` oldest items as ``(seq, kind, payload)``, oldest first (not removed)."""
        with self._lock:
            got = self._db.execute("SELECT seq, kind, item FROM spool ORDER BY seq LIMIT ?",
                                   (limit,)).fetchall()
        return [(int(s), str(k), json.loads(v)) for s, k, v in got]

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
