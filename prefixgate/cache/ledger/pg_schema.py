"""The PostgreSQL ledger's schema, applied at start as numbered migrations (issue 26).

Why a plain migration table and not alembic: the ledger talks to PostgreSQL through psycopg
directly (no SQLAlchemy models for alembic to diff), its schema is three tables, and every
change so far has been "add a column" — a list of numbered SQL scripts applied in order, each
recorded in ``ledger_migrations (version, applied_at)``, is the whole need, with no second
dependency and no migration environment to ship. Replicas that start at the same moment apply
each script exactly once: :func:`migrate` holds a transaction-scoped advisory lock
(:data:`LOCK_KEY`) while it reads what is applied and applies the rest, in one transaction.

Tables (the same rows as the SQLite ledger, :mod:`prefixgate.cache.ledger.store`):

- ``requests``: ``id`` BIGSERIAL (commit order, what ``/api/savings`` compares to see new rows),
  ``row_id`` TEXT UNIQUE (chosen by the proxy: the insert is ``ON CONFLICT (row_id) DO NOTHING``),
  ``replica``, then every :class:`~prefixgate.cache.ledger.store.LedgerRow` column (REAL -> DOUBLE
  PRECISION, INTEGER and bool -> BIGINT 0/1, TEXT).
- ``breaks``: cache-break records as JSON text, with their tenant; ``break_id`` chosen by the
  proxy, like ``row_id``.
- ``rollup_tenant_minutes``: per-minute sums (:mod:`prefixgate.cache.ledger.rollup`), ``data`` as JSON
  text merged in Python under a row lock.

A LedgerRow column added later needs a migration here: :func:`missing_columns` names any column
the table lacks, and the ledger refuses to start writing until it is added.
"""

from __future__ import annotations

from typing import Any

from prefixgate.cache.ledger.store import COLUMNS

LOCK_KEY = 0x70676C6564676572  # "pgledger": the advisory lock held while migrating
MIGRATIONS: list[tuple[int, str]] = [
    (1, """
CREATE TABLE IF NOT EXISTS requests (
    id BIGSERIAL PRIMARY KEY, row_id TEXT NOT NULL UNIQUE, replica TEXT DEFAULT '',
    ts DOUBLE PRECISION, endpoint TEXT DEFAULT '', route TEXT DEFAULT '', backend TEXT DEFAULT '',
    model TEXT DEFAULT '', stream BIGINT, rewrite BIGINT, status TEXT DEFAULT '',
    http_status BIGINT, prompt_tokens BIGINT, cached_tokens BIGINT, cache_write_tokens BIGINT,
    output_tokens BIGINT, ttft_ms DOUBLE PRECISION, tpot_ms DOUBLE PRECISION,
    total_ms DOUBLE PRECISION, edits TEXT DEFAULT '', tokens_pruned BIGINT,
    session TEXT DEFAULT '', cf_cached_tokens BIGINT, input_usd DOUBLE PRECISION,
    cf_input_usd DOUBLE PRECISION, cf_source TEXT DEFAULT '', error TEXT DEFAULT '',
    key_id TEXT DEFAULT '', holdout BIGINT, ttft_source TEXT DEFAULT '', queue_ms DOUBLE PRECISION,
    prefill_ms DOUBLE PRECISION, decode_ms DOUBLE PRECISION, pass_tokens TEXT DEFAULT '',
    tenant TEXT DEFAULT '', deployment TEXT DEFAULT '', attempts BIGINT,
    attempt_reasons TEXT DEFAULT '', stood_back TEXT DEFAULT '');
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
CREATE TABLE IF NOT EXISTS breaks (
    id BIGSERIAL PRIMARY KEY, break_id TEXT NOT NULL UNIQUE, ts DOUBLE PRECISION,
    session TEXT, record TEXT, tenant TEXT DEFAULT '');
CREATE INDEX IF NOT EXISTS breaks_ts ON breaks (ts);
CREATE TABLE IF NOT EXISTS rollup_tenant_minutes (
    minute BIGINT, route TEXT, model TEXT, backend TEXT, tenant TEXT, data TEXT NOT NULL,
    PRIMARY KEY (minute, route, model, backend, tenant));
"""),
    (2, "CREATE INDEX IF NOT EXISTS requests_replica ON requests (replica, ts)"),
    (3, "ALTER TABLE requests ADD COLUMN IF NOT EXISTS span_reused_tokens BIGINT"),
    (4, "ALTER TABLE requests ADD COLUMN IF NOT EXISTS reported_miss TEXT DEFAULT '', "
        "ADD COLUMN IF NOT EXISTS reported_missed_tokens BIGINT, "
        "ADD COLUMN IF NOT EXISTS reported_reusable_tokens BIGINT, "
        "ADD COLUMN IF NOT EXISTS predicted_miss TEXT DEFAULT ''"),  # issue 35 (3: issue 33's)
    (5, "ALTER TABLE requests ADD COLUMN IF NOT EXISTS trial TEXT DEFAULT ''"),  # issue 36
]
"""(version, SQL) in order; a script is never edited once released, only followed."""


def migrate(conn: Any) -> list[int]:
    """Apply the migrations ``conn`` (a psycopg connection, not in a transaction) lacks, in one
    transaction under :data:`LOCK_KEY`; return the versions applied now (empty: up to date)."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        conn.execute("CREATE TABLE IF NOT EXISTS ledger_migrations (version INTEGER PRIMARY KEY, "
                     "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        have = {r[0] for r in conn.execute("SELECT version FROM ledger_migrations").fetchall()}
        for version, sql in MIGRATIONS:
            if version in have:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO ledger_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied


def missing_columns(conn: Any) -> list[str]:
    """LedgerRow columns the ``requests`` table lacks (a migration is missing), sorted."""
    got = conn.execute("SELECT column_name FROM information_schema.columns "
                       "WHERE table_schema = current_schema() AND table_name = 'requests'").fetchall()
    have = {r[0] for r in got}
    return sorted(set(COLUMNS) - have)
