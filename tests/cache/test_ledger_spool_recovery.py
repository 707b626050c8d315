"""An unusable spool never stops the proxy (issue 34, item 8): a file that is not a spool is moved
aside (renamed with a UTC timestamp, logged) and a new spool made; a path that cannot be made
degrades to a spool in memory with a clear error; an item that no longer decodes is removed when
met, so the items behind it still drain. The same for the SQLite ledger's own file when serving.
The serve-level check (PostgreSQL up, ``build_app`` with
the policy's ledger) is in ``tests/ledger_pg/test_pg_spool_start.py``."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import httpx
import pytest

from prefixgate.cache.ledger.spool import Spool
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.ledger.writer import open_ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import LedgerSettings
from prefixgate.proxy.app import build_app
from tests.servers import serve_app

CORRUPT = {
    "not sqlite": b"this is not a database\n" * 200,
    "damaged header": b"SQLite format 3\x00" + b"\xff" * 4080,
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_spool_is_moved_aside_and_a_new_one_made(tmp_path: Path, case: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "spool.sqlite"
    path.write_bytes(CORRUPT[case])
    with caplog.at_level(logging.ERROR, logger="prefixgate.ledger"):
        sp = Spool(path, 10)
    assert sp.path == str(path) and sp.error == ""
    assert sp.put([("row", {"i": 1})]) == 0 and sp.size() == 1
    aside = sorted(tmp_path.glob("spool.sqlite.corrupt-*"))
    assert [p.name for p in aside] == [Path(sp.moved_aside or "").name]
    assert aside[0].read_bytes() == CORRUPT[case]  # kept as it was, for a person to read
    assert any("moved aside to" in r.getMessage() and str(aside[0]) in r.getMessage()
               for r in caplog.records)
    sp.close()


def test_a_sqlite_file_of_another_shape_is_moved_aside_too(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE spool (id INTEGER PRIMARY KEY, payload BLOB)")
    db.execute("INSERT INTO spool (payload) VALUES (x'00')")
    db.commit()
    db.close()
    sp = Spool(path, 10)
    assert sp.moved_aside is not None and sp.size() == 0
    sp.put([("row", {"i": 1})])
    assert [p for _, _, p in sp.peek(5)] == [{"i": 1}]
    sp.close()


@pytest.mark.parametrize("how", ["parent is a file", "path is a folder"])
def test_a_spool_that_cannot_be_made_degrades_to_memory_with_an_error(
        tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    if how == "parent is a file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "spool.sqlite"
    else:
        path = tmp_path / "spool.sqlite"
        path.mkdir()
    with caplog.at_level(logging.ERROR, logger="prefixgate.ledger"):
        sp = Spool(path, 3)
    assert sp.path == ":memory:" and sp.error
    assert any("kept in memory instead" in r.getMessage() for r in caplog.records)
    assert sp.put([("row", {"i": i}) for i in range(5)]) == 2  # the same bound
    assert [p["i"] for _, _, p in sp.peek(10)] == [0, 1, 2]
    sp.close()


def test_an_item_that_no_longer_decodes_is_removed_and_the_rest_drain(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite"
    sp = Spool(path, 10)
    sp.put([("row", {"i": 0}), ("row", {"i": 1}), ("row", {"i": 2})])
    raw = sqlite3.connect(path)
    raw.execute("UPDATE spool SET item = '{\"i\": 1, trunc' WHERE seq = 2")
    raw.execute("INSERT INTO spool (kind, item) VALUES ('mystery', '{}')")
    raw.commit()
    raw.close()
    got = sp.peek(10)
    assert [p["i"] for _, _, p in got] == [0, 2]
    assert sp.undecodable == 2 and sp.size() == 2
    sp.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_corrupt_sqlite_ledger_is_moved_aside_when_serving(tmp_path: Path, batched: bool) -> None:
    """The same class for the SQLite ledger itself: the serving path (``open_ledger``) moves a
    corrupt file aside and starts a new one; a reader (``prefixgate report``) is refused, never
    given a fresh empty file in its place."""
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(CORRUPT["not sqlite"])
    with pytest.raises(sqlite3.DatabaseError):
        Ledger(path)  # a reader: the file is left as it is
    assert path.read_bytes() == CORRUPT["not sqlite"]
    led = open_ledger(LedgerSettings(path=str(path), batch_writes=batched))
    led.write(LedgerRow(model="m"))
    assert [r["model"] for r in led.rows()] == ["m"]
    assert led.moved_aside is not None and led.state()["error"] == ""
    assert Path(led.moved_aside).read_bytes() == CORRUPT["not sqlite"]
    led.close()


def test_an_uncreatable_sqlite_ledger_serves_from_memory_and_healthz_says_so(
        tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "ledger.sqlite"
    policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                              "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "e"}],
                           "ledger": {"path": str(path)}})
    app = build_app(policy, analyze=False)  # before: FileExistsError, serve did not start
    with serve_app(app) as url:
        h = httpx.get(url + "/healthz", timeout=30)
        assert h.status_code == 200
        assert h.json()["ledger"]["kind"] == "sqlite" and h.json()["ledger"]["error"]
        assert str(tmp_path) not in h.json()["ledger"]["error"]  # /healthz is open: no paths
    led = app.state.proxy.ledger
    led.write(LedgerRow(model="m"))
    assert [r["model"] for r in led.rows()] == ["m"]
    led.close()
