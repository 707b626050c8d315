"""The provider-diagnostics columns (issue 35) in a PostgreSQL ledger: added by migration 4,
written and read back, and counted by ``/api/savings``' ``provider_misses``."""

from __future__ import annotations

import time
from pathlib import Path

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.savings.summary import savings_document


def test_reported_miss_columns_round_trip(fresh_pg: str, tmp_path: Path) -> None:
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite")
    now = time.time()
    pg.write(LedgerRow(ts=now, model="m", reported_miss="tools_changed",
                       reported_missed_tokens=1536, reported_reusable_tokens=2048,
                       predicted_miss="tools"))
    pg.write(LedgerRow(ts=now, model="m"))
    pg.flush()
    rows = pg.rows(now - 1)
    got = sorted((r["reported_miss"], r["reported_missed_tokens"], r["reported_reusable_tokens"],
                  r["predicted_miss"]) for r in rows)
    assert got == [("", None, None, ""), ("tools_changed", 1536, 2048, "tools")]
    pm = savings_document(pg, "1h", now=now)["provider_misses"]
    assert pm["reported"] == {"tools_changed": 1} and pm["agreement"]["tools"]["share"] == 1.0
    pg.close()
