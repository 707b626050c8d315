"""The savings ledger: one SQLite row per proxied request, never prompt text.

A :class:`LedgerRow` is filled while the request runs and written once, atomically, when it ends
— also when it ends in an error or a client disconnect (``status`` says which). The database is
in WAL mode so ``prefixgate report`` can read while the proxy writes.

Columns (units): ``ts`` unix seconds; ``ttft_ms`` / ``tpot_ms`` / ``total_ms`` milliseconds;
token columns are tokens (NULL = the upstream did not report it); ``session`` is a sha256 prefix
of the session id, never the id itself. ``cf_cached_tokens`` is the counterfactual: what the
backend would have cached had the client's original body been sent (NULL when not estimated);
``input_usd`` / ``cf_input_usd`` price the prompt from the backend's usage and from that
counterfactual (USD, NULL for unpriced models such as the local engine). ``key_id`` is the
public id of the proxy key the request authenticated with ("" without proxy keys), never the key.
``deployment`` names the deployment that answered, ``attempts`` counts the sends (retries and
fallbacks included), ``attempt_reasons`` lists the failed ones (``<deployment>:<why>``).
A second table, ``breaks``, keeps cache-break records (:mod:`cache.breaks`) as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# 2: key_id column; 3: deployment, attempts, attempt_reasons (issue 10). Older files are
# migrated on open (ALTER TABLE ADD COLUMN).
SCHEMA_VERSION = 3


@dataclass
class LedgerRow:
    """One request's record (see module docstring for units)."""

    ts: float = field(default_factory=time.time)
    endpoint: str = ""
    route: str = ""
    backend: str = ""
    model: str = ""
    stream: bool = False
    rewrite: bool = False
    status: str = "ok"            # ok | upstream_error | client_disconnect | bad_request | ...
    http_status: int = 200
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    output_tokens: int | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    total_ms: float | None = None
    edits: str = ""
    tokens_pruned: int = 0
    session: str = ""
    cf_cached_tokens: int | None = None
    input_usd: float | None = None
    cf_input_usd: float | None = None
    error: str = ""
    key_id: str = ""              # the proxy key's public id, never the key
    deployment: str = ""          # the deployment that answered (its name, never its URL)
    attempts: int = 0             # sends made (retries and fallbacks included)
    attempt_reasons: str = ""     # failed sends, "<deployment>:<why>" comma-joined


def _column_type(tp: Any) -> str:
    name = str(tp)
    if "float" in name:
        return "REAL"
    if "int" in name or "bool" in name:
        return "INTEGER"
    return "TEXT"


COLUMNS = [f.name for f in fields(LedgerRow)]


class Ledger:
    """SQLite ledger at ``path`` (``~`` expanded, parent made). Thread-safe: one connection,
    one lock; each :meth:`write` is one transaction. ``":memory:"`` works for tests."""

    def __init__(self, path: str | Path) -> None:
        p = str(path)
        if p != ":memory:":
            fp = Path(p).expanduser()
            fp.parent.mkdir(parents=True, exist_ok=True)
            p = str(fp)
        self.path = p
        self._lock = threading.Lock()
        self._db = sqlite3.connect(p, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        cols = ", ".join(f"{f.name} {_column_type(f.type)}" for f in fields(LedgerRow))
        self._db.execute(f"CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, {cols})")
        self._db.execute("CREATE TABLE IF NOT EXISTS breaks (id INTEGER PRIMARY KEY, ts REAL, "
                         "session TEXT, record TEXT)")
        have = {r[1] for r in self._db.execute("PRAGMA table_info(requests)")}
        for f in fields(LedgerRow):  # migration: add the columns a newer version defines
            if f.name not in have:
                default = " DEFAULT ''" if _column_type(f.type) == "TEXT" else ""
                self._db.execute(f"ALTER TABLE requests ADD COLUMN {f.name} "
                                 f"{_column_type(f.type)}{default}")
        if self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def write(self, row: LedgerRow) -> int:
        """Insert ``row`` in one transaction; return its id."""
        values = asdict(row)
        sql = (f"INSERT INTO requests ({', '.join(COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in COLUMNS)})")
        with self._lock:
            cur = self._db.execute(sql, [values[c] for c in COLUMNS])
            return int(cur.lastrowid or 0)

    def rows(self, since_ts: float = 0.0) -> list[dict[str, Any]]:
        """All rows with ``ts >= since_ts``, oldest first, as dicts keyed by column name."""
        with self._lock:
            cur = self._db.execute(
                f"SELECT id, {', '.join(COLUMNS)} FROM requests WHERE ts >= ? ORDER BY id",
                (since_ts,))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    def write_break(self, session: str, record: dict[str, Any]) -> None:
        """Store one cache-break record (``cache.breaks.BreakRecord.to_dict()``) as JSON;
        ``session`` is the hashed session id."""
        with self._lock:
            self._db.execute("INSERT INTO breaks (ts, session, record) VALUES (?, ?, ?)",
                             (time.time(), session, json.dumps(record)))

    def breaks(self, since_ts: float = 0.0) -> list[dict[str, Any]]:
        """Stored break records, oldest first (the dicts given to :meth:`write_break`)."""
        with self._lock:
            cur = self._db.execute("SELECT record FROM breaks WHERE ts >= ? ORDER BY id",
                                   (since_ts,))
            return [json.loads(r[0]) for r in cur.fetchall()]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
