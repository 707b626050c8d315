"""The PostgreSQL ledger against a real server: the same rows, rollups and queries as SQLite,
schema migrations applied once, every row recorded exactly once however often it is sent, and
the replica column that splits ``report`` and ``/api/savings``."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from prefixgate.cache.ledger.pg import PgLedger, insert_items, pg_sql
from prefixgate.cache.ledger.pg_schema import MIGRATIONS, migrate, missing_columns
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.ledger.writer import open_ledger
from prefixgate.cache.savings.report import group_figures
from prefixgate.cache.savings.summary import savings_document
from prefixgate.config.schema import LedgerSettings

T0 = 1_800_000_000.0


def _rows(n: int, **kw: object) -> list[LedgerRow]:
    return [LedgerRow(ts=T0 + i, model="m", route="r", prompt_tokens=100 + i, cached_tokens=i,
                      status="ok" if i % 10 else "upstream_error", stream=bool(i % 2),
                      tenant="acme" if i % 3 else "other", **kw)  # type: ignore[arg-type]
            for i in range(n)]


def _count(url: str, sql: str = "SELECT count(*) FROM requests") -> int:
    with psycopg.connect(url) as c:
        return int(c.execute(sql).fetchone()[0])  # type: ignore[index]


def test_pg_sql_turns_qmarks_into_psycopg_placeholders() -> None:
    assert pg_sql("SELECT a FROM t WHERE b = ? AND c LIKE '5%' AND d = ?") == (
        "SELECT a FROM t WHERE b = %s AND c LIKE '5%%' AND d = %s")


def test_rows_rollups_and_savings_match_the_sqlite_ledger(fresh_pg: str, tmp_path: Path) -> None:
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite", replica="a")
    lite = Ledger(tmp_path / "l.sqlite", replica="a")
    for a, b in zip(_rows(150), _rows(150)):
        pg.write(a)
        lite.write(b)
    pg.write_break("s1", {"region": "tools", "kind": "reorder", "token_offset": 3,
                          "tokens_lost": 40}, "acme")
    lite.write_break("s1", {"region": "tools", "kind": "reorder", "token_offset": 3,
                            "tokens_lost": 40}, "acme")
    drop = ("id", "row_id")  # ids are each database's own
    got = [{k: v for k, v in r.items() if k not in drop} for r in pg.rows()]
    want = [{k: v for k, v in r.items() if k not in drop} for r in lite.rows()]
    assert got == want and len(got) == 150
    assert pg.rollups(T0, T0 + 3600) == lite.rollups(T0, T0 + 3600)
    assert pg.rollups(T0, T0 + 3600, "acme") == lite.rollups(T0, T0 + 3600, "acme")
    assert pg.breaks(0, "acme") == lite.breaks(0, "acme") != []
    assert pg.breaks(0, "other") == []
    now = T0 + 200
    a = savings_document(pg, "1h", now=now, tenant="acme")
    b = savings_document(lite, "1h", now=now, tenant="acme")
    assert a == b and a["totals"]["requests"] == 100
    pg.close()
    lite.close()


def test_a_batch_sent_twice_is_recorded_once_and_folded_once(fresh_pg: str, tmp_path: Path) -> None:
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite")
    pg.write(LedgerRow(ts=T0, model="warm"))  # the writer creates the schema
    pg.flush()
    items = [("row", {**r.__dict__, "replica": "x"}) for r in _rows(20)]
    with psycopg.connect(fresh_pg, autocommit=True) as conn:
        assert insert_items(conn, items) == 20
        assert insert_items(conn, items) == 0  # the acknowledgement was "lost": sent again
        assert insert_items(conn, items[:5] + [("row", {**_rows(1)[0].__dict__})]) == 1
    assert _count(fresh_pg) == 22
    rolled = [r for r in pg.rollups(T0, T0 + 3600) if r["model"] == "m"]
    assert sum(r["data"]["requests"] for r in rolled) == 21  # the duplicates folded nowhere
    assert sum(r["data"]["prompt_tokens"] for r in rolled) == sum(100 + i for i in range(20)) + 100
    pg.close()


def test_concurrent_replicas_fold_the_same_minutes_without_losing_a_count(
        fresh_pg: str, tmp_path: Path) -> None:
    leds = [PgLedger(fresh_pg, spool_path=tmp_path / f"s{i}.sqlite", replica=f"r{i}",
                     flush_interval_s=0.001) for i in range(3)]
    leds[0].write(LedgerRow(ts=T0, model="warm"))
    leds[0].flush()

    def burst(led: PgLedger) -> None:
        for _ in range(10):
            for r in _rows(30):
                led.write(r)
            led.flush()

    threads = [threading.Thread(target=burst, args=(led,)) for led in leds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rolled = [r for r in leds[0].rollups(T0, T0 + 3600) if r["model"] == "m"]
    assert sum(r["data"]["requests"] for r in rolled) == 900
    assert _count(fresh_pg, "SELECT count(DISTINCT row_id) FROM requests") == 901
    by = {g["replica"]: g["requests"] for g in group_figures(leds[0].rows(T0 + 1), "replica")}
    assert by == {"r0": 290, "r1": 290, "r2": 290}  # ts >= T0 + 1: rows 1..29 of 10 bursts
    for led in leds:
        led.close()


def test_migrations_apply_once_and_say_which(fresh_pg: str) -> None:
    with psycopg.connect(fresh_pg, autocommit=True) as conn:
        assert migrate(conn) == [v for v, _ in MIGRATIONS]
        assert migrate(conn) == []
        assert missing_columns(conn) == []
        conn.execute("ALTER TABLE requests DROP COLUMN stood_back")
        assert missing_columns(conn) == ["stood_back"]
        n = conn.execute("SELECT count(*) FROM ledger_migrations").fetchone()
        assert n is not None and n[0] == len(MIGRATIONS)


def test_a_ledger_missing_a_column_refuses_to_write_and_spools(fresh_pg: str,
                                                                tmp_path: Path) -> None:
    with psycopg.connect(fresh_pg, autocommit=True) as conn:
        migrate(conn)
        conn.execute("ALTER TABLE requests DROP COLUMN stood_back")
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite", retry_s=60)
    pg.write(LedgerRow(model="m"))
    pg.flush()
    assert pg.state()["up"] is False and pg.state()["spooled_rows"] == 1
    assert _count(fresh_pg) == 0
    pg.close()


def test_rows_carry_the_replica_and_savings_split_by_it(fresh_pg: str, tmp_path: Path) -> None:
    a = PgLedger(fresh_pg, spool_path=tmp_path / "a.sqlite", replica="east:1")
    b = PgLedger(fresh_pg, spool_path=tmp_path / "b.sqlite", replica="west:2")
    now = time.time()
    for i in range(6):
        a.write(LedgerRow(ts=now, model="m", prompt_tokens=100, cached_tokens=50))
    for i in range(4):
        b.write(LedgerRow(ts=now, model="m", prompt_tokens=100, cached_tokens=10,
                          status="upstream_error" if i == 0 else "ok",
                          replica="named-by-caller"))
    a.flush()
    b.flush()
    doc = savings_document(a, "1h", now=now)
    assert [(r["replica"], r["requests"], r["errors"], r["cached_share"])
            for r in doc["replicas"]] == [("east:1", 6, 0, 0.5), ("named-by-caller", 4, 1, 0.1)]
    a.close()
    b.close()


def test_open_ledger_picks_postgres_for_a_url(fresh_pg: str, tmp_path: Path) -> None:
    led = open_ledger(LedgerSettings(url=fresh_pg, spool_path=str(tmp_path / "s.sqlite"),
                                     replica="named"))
    assert isinstance(led, PgLedger) and led.replica == "named" and led.kind == "postgresql"
    led.close()
    lite = open_ledger(LedgerSettings(path=str(tmp_path / "l.sqlite")))
    assert not isinstance(lite, PgLedger) and lite.kind == "sqlite"
    lite.close()


def test_a_url_that_is_not_postgres_is_refused() -> None:
    with pytest.raises(ValueError, match="postgresql://"):
        LedgerSettings(url="mysql://x")


def test_the_timer_commits_queued_rows_without_a_flush(fresh_pg: str, tmp_path: Path) -> None:
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "s.sqlite", flush_interval_s=0.05)
    for r in _rows(3):
        pg.write(r)
    deadline = time.monotonic() + 20
    while pg.written < 3 and time.monotonic() < deadline:  # nobody flushes: the timer does
        time.sleep(0.02)
    assert pg.written == 3 and pg.state()["queued"] == 0
    assert _count(fresh_pg) == 3
    pg.close()


def test_a_closed_ledger_refuses_rows(fresh_pg: str, tmp_path: Path) -> None:
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "s.sqlite")
    pg.close()
    with pytest.raises(RuntimeError, match="closed"):
        pg.write(LedgerRow())


def test_replicas_starting_together_apply_each_migration_once(fresh_pg: str) -> None:
    barrier = threading.Barrier(4)
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def start() -> None:
        with psycopg.connect(fresh_pg, autocommit=True) as conn:
            barrier.wait()
            try:
                applied.append(migrate(conn))
            except BaseException as e:  # a race would surface here
                errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(applied, key=len) == [[], [], [], [v for v, _ in MIGRATIONS]]
    assert _count(fresh_pg, "SELECT count(*) FROM ledger_migrations") == len(MIGRATIONS)


def test_a_database_at_migration_2_gains_span_reused_tokens(fresh_pg: str, tmp_path: Path) -> None:
    # issue 33: a ledger written before the column existed is upgraded in place on start
    with psycopg.connect(fresh_pg, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE ledger_migrations (version INTEGER PRIMARY KEY, "
                         "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            for version, sql in MIGRATIONS[:2]:
                conn.execute(sql)
                conn.execute("INSERT INTO ledger_migrations (version) VALUES (%s)", (version,))
        # migration 3 (span reuse) and 4 (provider diagnostics, issue 35) are still to come
        assert "span_reused_tokens" in missing_columns(conn)
    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite")
    pg.write(LedgerRow(model="m", prompt_tokens=10, cached_tokens=8, span_reused_tokens=5))
    pg.flush()
    assert [r["span_reused_tokens"] for r in pg.rows()] == [5]
    pg.close()


def test_trial_rows_are_kept_apart_in_postgres(fresh_pg: str, tmp_path: Path) -> None:
    """Issue 36: a meaning-guard trial row is written (migration 5's ``trial`` column) but is in
    no rollup, no ``rows()`` and no savings figure; its cost is read on its own."""
    from prefixgate.cache.savings.trial_cost import trial_rows, trial_spend

    pg = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite", replica="a")
    plain = _rows(10)
    for r in plain:
        pg.write(r)
    before = (pg.rollups(T0, T0 + 3600), savings_document(pg, "1h", now=T0 + 200))
    for r in _rows(3, trial="hoist_volatile"):
        pg.write(r)
    assert len(pg.rows()) == 10 and len(pg.rows(trials=True)) == 13
    assert (pg.rollups(T0, T0 + 3600), savings_document(pg, "1h", now=T0 + 200)) == before
    assert trial_spend(trial_rows(pg))["requests"] == 3
    pg.close()
