"""One bad row costs one row (issue 34, item 3): a model name holding U+0000 — on a request the
proxy answered, or one it answered 400 — a lone surrogate, a usage count past BIGINT, are cleaned
and recorded with their batch; a value PostgreSQL still refuses is isolated by bisecting the
batch, and only that row is dropped, logged by ``row_id`` and counted (``bad_rows_dropped`` in
``/healthz``'s ``ledger`` and ``prefixgate_ledger_bad_rows_dropped``). The same holds for rows
drained from the spool after an outage."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.cache.ledger.sanitize import REPLACEMENT
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.ledger_pg.pg_servers import free_port
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

CLEANED: dict[str, dict[str, Any]] = {
    "nul model": {"model": "gpt\x00-4o"},
    "nul tenant": {"tenant": "acme\x00"},
    "lone surrogate model": {"model": "m\udc80"},
    "usage past BIGINT": {"prompt_tokens": 10 ** 20},
}


def settle(led: PgLedger) -> None:
    """Wait until nothing waits in the spool (a round past its deadline on a loaded machine
    spools what it had not committed yet; it drains at the next)."""
    deadline = time.monotonic() + 60  # against hanging, not a timing assertion
    while led.state()["spooled_rows"] and time.monotonic() < deadline:
        time.sleep(0.05)


def _models(url: str) -> list[str]:
    with psycopg.connect(url) as c:
        return [r[0] for r in c.execute("SELECT model FROM requests ORDER BY id").fetchall()]


@pytest.mark.parametrize("case", sorted(CLEANED))
def test_a_hostile_row_is_recorded_cleaned_with_its_whole_batch(fresh_pg: str, tmp_path: Path,
                                                                case: str) -> None:
    led = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite")
    with led._cv:  # the writer is held: the 40 rows go in one batch
        for i in range(40):
            led.write(LedgerRow(**{"model": f"m{i}", "tenant": "t",
                                   **(CLEANED[case] if i == 12 else {})}))
    led.flush(30)
    settle(led)
    models = _models(fresh_pg)
    assert len(models) == 40 and led.state()["bad_rows_dropped"] == 0
    assert [m for i, m in enumerate(models) if i != 12] == [f"m{i}" for i in range(40) if i != 12]
    if case == "nul model":
        assert models[12] == f"gpt{REPLACEMENT}-4o"
    assert sum(r["data"]["requests"] for r in led.rollups(0, 4e9)) == 40
    led.close()


def test_a_value_postgres_refuses_costs_that_row_only(fresh_pg: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Text in a BIGINT column stands for any value the cleaning does not know of."""
    led = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite")
    bad = LedgerRow(model="bad", prompt_tokens="many")  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="prefixgate.ledger"), led._cv:
        for i in range(40):
            led.write(bad if i == 28 else LedgerRow(model=f"m{i}"))
    led.flush(30)
    settle(led)
    assert _models(fresh_pg) == [f"m{i}" for i in range(40) if i != 28]
    assert led.state()["bad_rows_dropped"] == 1
    msgs = [r.getMessage() for r in caplog.records]
    assert any(bad.row_id in m and "dropped" in m for m in msgs)
    assert sum(r["data"]["requests"] for r in led.rollups(0, 4e9)) == 39
    led.close()


def test_a_bad_row_in_the_spool_costs_only_itself_when_the_outage_drains(fresh_pg: str,
                                                                          tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    down = PgLedger(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing", spool_path=spool,
                    retry_s=60)
    for i in range(50):
        row = LedgerRow(model="x\x00y" if i == 9 else f"m{i}")
        if i == 33:
            row.cached_tokens = "lots"  # type: ignore[assignment]
        down.write(row)
    down.flush(30)
    assert down.state()["spooled_rows"] == 50
    down.close()
    led = PgLedger(fresh_pg, spool_path=spool, retry_s=0.05)
    settle(led)
    models = _models(fresh_pg)
    assert len(models) == 49 and led.state()["bad_rows_dropped"] == 1
    assert models[9] == f"x{REPLACEMENT}y" and "m33" not in models
    led.close()


@pytest.mark.parametrize("answer", [200, 400])
def test_a_client_model_name_with_nul_never_erases_other_clients_rows(fresh_pg: str,
                                                                      tmp_path: Path,
                                                                      answer: int) -> None:
    """Through the proxy, as a client would: 20 requests of others around one whose model name
    holds U+0000, answered by the upstream (200) or refused by it (400)."""
    bad_model = "evil\x00model"
    script = Script(body=completion()) if answer == 200 else Script(
        status=400, body={"error": {"message": "unknown model", "type": "invalid_request_error"}})
    up = ScriptedUpstream(script=script)
    led = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite", flush_interval_s=0.5)
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False}})
        with serve_app(build_app(policy, ledger=led, analyze=False)) as url, \
                httpx.Client(timeout=30) as c:
            for i in range(21):
                model = bad_model if i == 10 else f"m{i}"
                c.post(url + "/v1/chat/completions",
                       json={"model": model, "messages": [{"role": "user", "content": "x"}]})
            led.flush(30)
            settle(led)
            models = _models(fresh_pg)
            assert len(models) == 21
            assert [m for m in models if m.startswith("m")] == [f"m{i}" for i in range(21)
                                                                if i != 10]
            h = c.get(url + "/healthz").json()
            assert h["ledger"]["bad_rows_dropped"] == 0
            assert "prefixgate_ledger_bad_rows_dropped 0.0" in c.get(url + "/metrics").text
    led.close()


def _astral(n: int, seed: int) -> str:
    """``n`` distinct-looking 4-byte characters (incompressible, so an index entry stays big)."""
    return "".join(chr(0x20000 + (seed * 7919 + i * 104729) % 0xFFFF) for i in range(n))


def test_a_row_too_big_for_an_index_is_isolated_not_taken_for_an_outage(fresh_pg: str,
                                                                         tmp_path: Path) -> None:
    """A rollup key of four 256-character names in 4-byte characters exceeds PostgreSQL's
    btree entry limit: SQLSTATE 54000, which psycopg files under OperationalError. Before, the
    writer took it for an outage: the batch went to the spool and stayed at its head for good,
    every later row behind it, ``up`` false forever. Now the row is isolated and dropped."""
    led = PgLedger(fresh_pg, spool_path=tmp_path / "spool.sqlite", retry_s=0.1)
    with led._cv:
        for i in range(40):
            if i == 5:
                led.write(LedgerRow(model=_astral(256, 1), route=_astral(256, 2),
                                    backend=_astral(256, 3), tenant=_astral(256, 4)))
            else:
                led.write(LedgerRow(model=f"m{i}"))
    led.flush(30)
    settle(led)
    assert _models(fresh_pg) == [f"m{i}" for i in range(40) if i != 5]
    st = led.state()
    assert st["bad_rows_dropped"] == 1 and st["spooled_rows"] == 0 and st["up"] is True
    led.close()


def test_errors_are_told_apart_by_sqlstate_class() -> None:
    from prefixgate.cache.ledger.pg import is_fault
    content = [psycopg.errors.ProgramLimitExceeded("index row size"),
               psycopg.errors.StringDataRightTruncation("too long"),
               psycopg.errors.UniqueViolation("dup"), psycopg.DataError("NUL byte"),
               UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")]
    faults = [psycopg.OperationalError("server closed the connection unexpectedly"),
              psycopg.errors.AdminShutdown("terminating"), psycopg.errors.QueryCanceled("timeout"),
              psycopg.errors.UndefinedTable("requests"), psycopg.errors.DiskFull("full"),
              psycopg.errors.SerializationFailure("retry"), psycopg.InterfaceError("closed")]
    assert [is_fault(e) for e in content] == [False] * len(content)
    assert [is_fault(e) for e in faults] == [True] * len(faults)
