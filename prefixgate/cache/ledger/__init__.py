"""The record: one ledger row per request, its stores (SQLite ``store``, PostgreSQL ``pg`` +
``pg_schema``), the writer thread and its spool, per-minute rollups, announced rows and the
per-pass split of each row's saving (``attribution``, which the rollups store); what keeps it
whole against hostile values (``sanitize``, ``isolate``) and a hung database (``watchdog``).
"""

__all__ = [
    "announced_rows", "attribution", "isolate", "pg", "pg_schema", "rollup", "sanitize", "spool",
    "store", "watchdog", "writer",
]
