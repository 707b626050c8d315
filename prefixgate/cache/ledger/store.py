"""The savings ledger: one SQLite row per proxied request, never prompt text.

A :class:`LedgerRow` is filled while the request runs and written once, atomically, when it ends
— also when it ends in an error or a client disconnect (``status`` says which). The database is
in WAL mode so ``prefixgate report`` can read while the proxy writes.

Columns (units): ``ts`` unix seconds; ``ttft_ms`` / ``tpot_ms`` / ``total_ms`` milliseconds;
token columns are tokens (NULL = the upstream did not report it); ``session`` is a sha256 prefix
of the session id, never the id itself. ``cf_cached_tokens`` is the counterfactual: what the
backend would have cached had the client's original body been sent (NULL when not estimated);
``input_usd`` / ``cf_input_usd`` price the prompt from the backend's usage and from that
counterfactual (USD, NULL for unpriced models such as the local engine). ``cf_source`` says how
the counterfactual was obtained: ``measured`` (the client's own body went upstream, so its
measured cached tokens are the counterfactual), ``modelled`` (a provider cache model, or the
radix model over the backend's own token ids), ``holdout`` (a session sent unrewritten on
purpose), ``""`` (none); reports must not mix them silently. ``key_id`` is the
public id of the proxy key the request authenticated with ("" without proxy keys), never the key;
``tenant`` the request's tenant (:mod:`prefixgate.proxy.http.tenants`, "" for none).
``deployment`` names the deployment that answered, ``attempts`` counts the sends (retries and
fallbacks included), ``attempt_reasons`` lists the failed ones (``<deployment>:<why>``).
``stood_back``: the passes the route's stand-back switched off for this request and why
(``hoist_volatile: rewritten arm no better than unrewritten (...)``,
:mod:`prefixgate.cache.savings.stand_back`; "" when none was).
Issue 26 columns: ``row_id`` (32 hex chars, chosen by the proxy when the row is made: a shared
PostgreSQL ledger, :mod:`prefixgate.cache.ledger.pg`, inserts it ``ON CONFLICT DO NOTHING`` so a
row re-sent after a lost acknowledgement is recorded once), ``replica`` (the proxy process that
served the request: ``ledger.replica`` or ``<hostname>:<pid>``, :func:`default_replica`).
Issue 35 columns: ``reported_miss`` (the provider's own cache-miss reason as it wrote it:
Anthropic ``diagnostics.cache_miss_reason.type`` or ``pending``, OpenAI Responses
``prompt_cache_diagnostics`` reason / type; "" when the answer carried none),
``reported_missed_tokens`` / ``reported_reusable_tokens`` (its token counts, NULL when not
reported) and ``predicted_miss`` (prefixgate's own predicted cause in the same vocabulary, set on
rows with a reported reason; :mod:`prefixgate.cache.savings.miss_causes`).

Issue 33 column: ``span_reused_tokens`` — of ``cached_tokens``, the prompt tokens our engine
reused across a changed span (a clock, an id) after its prefix match stopped: the engine's own
count (``prompt_tokens_details.span_reused_tokens``), NULL where the backend reports none. The
counterfactual is a prefix cache: a row measured as sent has ``cf_cached_tokens = cached_tokens -
span_reused_tokens`` (:mod:`prefixgate.cache.savings.counterfactual`), and the technique
``span reuse (engine)`` holds those tokens (:mod:`prefixgate.cache.ledger.attribution`).
Issue 36 column: ``trial`` — the move a meaning-guard trial send judged
(:mod:`prefixgate.proxy.pipeline.guard_trial`; "" for a client's request). Trial rows are never
a client's answer and never a saving: they are not folded into the rollups
(:func:`prefixgate.cache.ledger.rollup.counted`), :meth:`Ledger.rows` leaves them out unless
asked, and every savings reader filters ``trial = ''``; their cost is summed on its own
(:mod:`prefixgate.cache.savings.trial_cost`).
A second table, ``breaks``, keeps cache-break records (:mod:`prefixgate.cache.savings.breaks`) as JSON with
their request's tenant; a third, ``rollup_tenant_minutes``, per-minute sums per tenant updated in
the same transaction as each row (:mod:`prefixgate.cache.ledger.rollup`). Readers may ask for one
tenant's share (``tenant=``: that tenant and its sub-tenants,
:func:`prefixgate.cache.ledger.rollup.tenant_filter`).

Issue 9 columns: ``holdout`` (1 = the session was in the holdout and went out unrewritten),
``cf_source`` (how the counterfactual was obtained: measured | modelled | holdout | ""),
``ttft_source`` (``measured`` = timed by the proxy on a stream, ``reported`` = the backend's own
TTFT header on a non-streamed answer, "" = none), ``queue_ms`` / ``prefill_ms`` /
``decode_ms`` (where the backend reports them, else NULL), ``pass_tokens`` (JSON
``{pass: {"reusable", "removed", "added"}}`` of the applied passes, token counts only; see
:mod:`prefixgate.cache.ledger.attribution`).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.announced_rows import AnnouncedRows
from prefixgate.cache.ledger.local_file import open_or_recover
from prefixgate.cache.ledger.sanitize import clean_row, clean_text

SCHEMA_VERSION = 10  # 2: key_id; 3: issue 9 columns + rollup_minutes; 4: tenant;
# 5: deployment, attempts, attempt_reasons; 6: stood_back; 7: breaks.tenant, rollups per
# tenant (rollup_tenant_minutes); 8: row_id, replica; 9: span_reused_tokens; 10: trial. Older
# files are
# migrated on open (ADD COLUMN, rollups refolded).


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
    cf_source: str = ""           # measured | modelled | holdout | "" (none)
    error: str = ""
    key_id: str = ""              # the proxy key's public id, never the key
    holdout: bool = False         # sent unrewritten as part of the holdout A/B
    ttft_source: str = ""         # measured | reported | ""
    queue_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    pass_tokens: str = ""         # JSON {pass: {reusable, removed, added}}, tokens only
    tenant: str = ""              # http.tenants: "" = no tenant (single-tenant proxy)
    deployment: str = ""          # the deployment that answered (its name, never its URL)
    attempts: int = 0             # sends made (retries and fallbacks included)
    attempt_reasons: str = ""     # failed sends, "<deployment>:<why>" comma-joined
    stood_back: str = ""          # passes the route's stand-back switched off, and why
    row_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # written once (issue 26)
    replica: str = ""             # the proxy process that served it ("" = the ledger's own)
    reported_miss: str = ""       # the provider's own cache-miss reason, as written (issue 35)
    reported_missed_tokens: int | None = None    # tokens the provider says it could not reuse
    reported_reusable_tokens: int | None = None  # OpenAI comparison_reusable_tokens
    predicted_miss: str = ""      # prefixgate's predicted cause, set where a reason is reported
    span_reused_tokens: int | None = None  # of cached_tokens: reused across a changed span
    trial: str = ""               # a meaning-guard trial send: the move judged ("" = client's)


class LedgerUnavailable(RuntimeError):
    """The ledger's database cannot be read now: unreachable, hung past the reader's deadline,
    or out of pooled connections (a shared PostgreSQL ledger; a SQLite file never raises it).
    Callers answer "try again later" (``/api/savings``: 503), not a bug."""


def default_replica() -> str:
    """This process's replica name when the policy sets none: ``<hostname>:<pid>`` (each
    ``--workers`` process is its own replica)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _column_type(tp: Any) -> str:
    name = str(tp)
    if "float" in name:
        return "REAL"
    if "int" in name or "bool" in name:
        return "INTEGER"
    return "TEXT"


COLUMNS = [f.name for f in fields(LedgerRow)]
CLIENT_ROWS = "COALESCE(trial, '') = ''"
"""SQL condition keeping the clients' rows (not meaning-guard trial sends): every reader of
savings figures adds it."""


class Ledger:
    """SQLite ledger at ``path`` (``~`` expanded, parent made). Thread-safe: one connection,
    one lock; each :meth:`write` is one transaction. ``":memory:"`` works for tests.
    ``replica``: the name stamped on rows written without one (default :func:`default_replica`).
    ``recover`` (the serving path, :func:`prefixgate.cache.ledger.writer.open_ledger`): a file that
    is not a usable ledger is moved aside and a new one made, a path that cannot be created
    degrades to a ledger in memory (:mod:`prefixgate.cache.ledger.local_file`; ``error`` says
    why); without it (a reader such as ``prefixgate report``) such a file raises.

    This class is also the interface every ledger keeps (:class:`prefixgate.cache.ledger.pg.PgLedger`
    overrides each public method): ``write``, ``query``, ``rollups``, ``rows``, ``write_break``,
    ``breaks``, ``flush``, ``close``, ``state``."""

    kind = "sqlite"
    shutdown_s: float | None = None
    """Longest the app's shutdown waits in :meth:`flush` (None: until done; a local file
    does not hang)."""

    def __init__(self, path: str | Path, replica: str | None = None, *,
                 recover: bool = False) -> None:
        self.replica = replica or default_replica()
        self._lock = threading.Lock()
        self.announced = AnnouncedRows()  # rows the proxy has answered for, not yet written
        self.moved_aside: str | None = None
        self.error = ""
        """Why the ledger is in memory instead of at ``path`` ("" when it is not)."""
        if recover:  # serving: an unusable file never stops the proxy (issue 34)
            opened = open_or_recover(str(path), self._open_db, "ledger")
            self.path, self.moved_aside, self.error = opened.path, opened.moved_aside, opened.error
            return
        p = str(path)
        if p != ":memory:":
            fp = Path(p).expanduser()
            fp.parent.mkdir(parents=True, exist_ok=True)
            p = str(fp)
        self.path = p
        self._open_db(p)

    def _open_db(self, p: str) -> sqlite3.Connection:
        """Open the file ``p`` as ``self._db``, create or migrate its tables; return it (closed
        again when anything fails)."""
        self._db = sqlite3.connect(p, check_same_thread=False, isolation_level=None)
        try:
            self._prepare()
        except BaseException:
            self._db.close()
            raise
        return self._db

    def _prepare(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        cols = ", ".join(f"{f.name} {_column_type(f.type)}" for f in fields(LedgerRow))
        self._db.execute(f"CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, {cols})")
        self._db.execute("CREATE TABLE IF NOT EXISTS breaks (id INTEGER PRIMARY KEY, ts REAL, "
                         "session TEXT, record TEXT, tenant TEXT DEFAULT '')")
        if "tenant" not in {r[1] for r in self._db.execute("PRAGMA table_info(breaks)")}:
            self._db.execute("ALTER TABLE breaks ADD COLUMN tenant TEXT DEFAULT ''")
        had_rollups = self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                                       "name=?", (rollup.TABLE,)).fetchone() is not None
        rollup.create(self._db)
        have = {r[1] for r in self._db.execute("PRAGMA table_info(requests)")}
        for f in fields(LedgerRow):  # migration: add the columns a newer version defines
            if f.name not in have:
                default = " DEFAULT ''" if _column_type(f.type) == "TEXT" else ""
                self._db.execute(f"ALTER TABLE requests ADD COLUMN {f.name} "
                                 f"{_column_type(f.type)}{default}")
        if not had_rollups:
            self._backfill_rollups()
        if self._db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _backfill_rollups(self) -> None:
        """Fold the rows of a ledger written before this version's rollup table existed (once,
        on first open by this version), in one transaction; the earlier tables are dropped."""
        cur = self._db.execute(f"SELECT {', '.join(COLUMNS)} FROM requests ORDER BY id")
        self._db.execute("BEGIN")
        try:
            for values in cur.fetchall():
                rollup.upsert(self._db, dict(zip(COLUMNS, values)))
            for old in rollup.OLD_TABLES:
                self._db.execute(f"DROP TABLE IF EXISTS {old}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def write(self, row: LedgerRow) -> int:
        """Insert ``row`` (its values cleaned, :mod:`prefixgate.cache.ledger.sanitize`) and fold it
        into its minute's rollup, in one transaction; return its id."""
        if not row.replica:
            row.replica = self.replica
        values = clean_row(asdict(row))
        sql = (f"INSERT INTO requests ({', '.join(COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in COLUMNS)})")
        with self._lock:
            self._db.execute("BEGIN")
            try:
                cur = self._db.execute(sql, [values[c] for c in COLUMNS])
                rollup.upsert(self._db, values)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return int(cur.lastrowid or 0)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only ``sql`` under the lock (for :mod:`prefixgate.cache.savings.summary`)."""
        self.announced.wait()  # rows already answered for (cache.announced_rows)
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def rollups(self, from_ts: float, to_ts: float,
                tenant: str | None = None) -> list[dict[str, Any]]:
        """Per-minute rollups in ``[from_ts, to_ts)`` (:func:`prefixgate.cache.ledger.rollup.read`),
        ``tenant``'s only when given."""
        self.announced.wait()  # rows already answered for (cache.announced_rows)
        with self._lock:
            return rollup.read(self._db, from_ts, to_ts, tenant)

    def rows(self, since_ts: float = 0.0, trials: bool = False) -> list[dict[str, Any]]:
        """All rows with ``ts >= since_ts``, oldest first, as dicts keyed by column name;
        meaning-guard trial rows only with ``trials`` (:data:`CLIENT_ROWS`)."""
        self.announced.wait()  # rows already answered for (cache.announced_rows)
        where = "" if trials else f" AND {CLIENT_ROWS}"
        with self._lock:
            cur = self._db.execute(
                f"SELECT id, {', '.join(COLUMNS)} FROM requests WHERE ts >= ?{where} ORDER BY id",
                (since_ts,))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    def write_break(self, session: str, record: dict[str, Any], tenant: str = "") -> None:
        """Store one cache-break record (``cache.savings.breaks.BreakRecord.to_dict()``) as JSON;
        ``session`` is the hashed session id, ``tenant`` its request's tenant."""
        with self._lock:
            self._db.execute("INSERT INTO breaks (ts, session, record, tenant) VALUES (?, ?, ?, ?)",
                             (time.time(), clean_text(session), json.dumps(record),
                              clean_text(tenant)))

    def breaks(self, since_ts: float = 0.0, tenant: str | None = None) -> list[dict[str, Any]]:
        """Stored break records, oldest first (the dicts given to :meth:`write_break`);
        ``tenant``'s and its sub-tenants' only when given."""
        self.announced.wait()  # rows already answered for (cache.announced_rows)
        where, params = rollup.tenant_filter(tenant)
        with self._lock:
            cur = self._db.execute(f"SELECT record FROM breaks WHERE ts >= ?{where} ORDER BY id",
                                   (since_ts, *params))
            return [json.loads(r[0]) for r in cur.fetchall()]

    def flush(self, timeout_s: float | None = None) -> None:
        """Return once every written row is on disk (each :meth:`write` already is; a batched
        ledger, :class:`prefixgate.cache.ledger.writer.BatchedLedger`, waits for its queue here)."""

    def state(self) -> dict[str, Any]:
        """What ``/healthz`` and the gauges say of the ledger: ``{"kind", "up", "spooled_rows",
        "spool_dropped", "queued", "error"}`` (a SQLite file is always up and never spools;
        ``error``: why it is in memory instead of its file, "" when it is not)."""
        return {"kind": self.kind, "up": True, "spooled_rows": 0, "spool_dropped": 0, "queued": 0,
                "error": self.error}

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
