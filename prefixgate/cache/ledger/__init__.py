"""The record: one ledger row per request, its stores (SQLite ``store``, PostgreSQL ``pg`` +
``pg_schema``), the writer thread and its spool, per-minute rollups and announced rows.
"""

__all__ = [
    "announced_rows", "attribution", "pg", "pg_schema", "rollup", "spool", "store", "writer",
]
