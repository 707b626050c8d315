"""The record: one ledger row per request, its stores (SQLite ``store``, PostgreSQL ``pg`` +
``pg_schema``), the writer thread and its spool, per-minute rollups, announced rows and the
per-pass split of each row's saving (``attribution``, which the rollups store).
"""

__all__ = [
    "announced_rows", "attribution", "pg", "pg_schema", "rollup", "spool", "store", "writer",
]
