"""A batch folded into the rollups at once stores what row-by-row upserts store
(:func:`prefixgate.cache.ledger.rollup.upsert_many`, the batched ledger writer's path, issue 25)."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.store import LedgerRow

_rows = st.lists(st.builds(
    LedgerRow,
    ts=st.sampled_from([1_800_000_000.0, 1_800_000_030.5, 1_800_000_075.0]),
    route=st.sampled_from(["a", "b"]), model=st.sampled_from(["gpt-4o", "m"]),
    status=st.sampled_from(["ok", "upstream_error"]),
    prompt_tokens=st.none() | st.integers(0, 50_000),
    cached_tokens=st.none() | st.integers(0, 50_000),
    output_tokens=st.none() | st.integers(0, 2_000),
    ttft_ms=st.none() | st.floats(0, 5_000), cf_cached_tokens=st.none() | st.integers(0, 9_000),
    input_usd=st.none() | st.floats(0, 1), cf_input_usd=st.none() | st.floats(0, 1),
    tokens_pruned=st.integers(0, 500), tenant=st.sampled_from(["", "t1"])), max_size=25)


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    rollup.create(db)
    return db


def _table(db: sqlite3.Connection) -> list[tuple[object, ...]]:
    return db.execute(f"SELECT minute, route, model, backend, tenant, data FROM {rollup.TABLE} "
                      "ORDER BY minute, route, model, backend, tenant").fetchall()


@settings(max_examples=60, deadline=None)
@given(first=_rows, second=_rows)
def test_a_batch_stores_what_row_by_row_upserts_store(first: list[LedgerRow],
                                                     second: list[LedgerRow]) -> None:
    one, many = _db(), _db()
    for batch in (first, second):  # the second batch meets what the first stored
        dicts = [asdict(r) for r in batch]
        for d in dicts:
            rollup.upsert(one, d)
        rollup.upsert_many(many, dicts)
    assert _table(many) == _table(one)
