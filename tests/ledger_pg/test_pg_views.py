"""One view of many replicas: ``/api/savings`` of any replica and ``prefixgate report`` read the
shared PostgreSQL ledger, every replica's rows, split by replica."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.cli import app as cli
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def _fleet_view(url: str, rows: int, wait_s: float = 15.0) -> dict[str, Any]:
    """``url``'s ``/api/savings`` once it counts ``rows`` requests (or at ``wait_s``): a replica
    waits for its own answered rows, while another replica's last rows may still be in its
    writer's batch (a 20 ms timer) when the read comes."""
    deadline = time.monotonic() + wait_s
    while True:
        doc: dict[str, Any] = httpx.get(url + "/api/savings", timeout=30).json()
        if doc["totals"]["requests"] >= rows or time.monotonic() > deadline:
            return doc
        time.sleep(0.05)


def test_each_replicas_savings_api_shows_the_whole_fleet(fresh_pg: str, tmp_path: Path) -> None:
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False}})
        leds = [PgLedger(fresh_pg, spool_path=tmp_path / f"s{i}.sqlite", replica=f"r{i}")
                for i in range(2)]
        with serve_app(build_app(policy, ledger=leds[0], analyze=False)) as a, \
                serve_app(build_app(policy, ledger=leds[1], analyze=False)) as b:
            for url, n in ((a, 3), (b, 2)):
                for _ in range(n):
                    assert httpx.post(url + "/v1/chat/completions", json=BODY,
                                      timeout=30).status_code == 200
            for url in (a, b):
                doc = _fleet_view(url, 5)
                assert doc["totals"]["requests"] == 5
                assert [(r["replica"], r["requests"]) for r in doc["replicas"]] == [
                    ("r0", 3), ("r1", 2)]
            h = httpx.get(a + "/healthz").json()
            assert h["ledger"]["up"] is True and h["ledger"]["spooled_rows"] == 0
    for led in leds:
        led.close()


def test_report_reads_the_database_by_url_and_splits_by_replica(fresh_pg: str,
                                                                tmp_path: Path) -> None:
    led = PgLedger(fresh_pg, spool_path=tmp_path / "s.sqlite", replica="east")
    for _ in range(4):
        led.write(LedgerRow(model="m", prompt_tokens=10))
    led.write(LedgerRow(model="m", prompt_tokens=10, replica="west"))
    led.close()
    res = CliRunner().invoke(cli, ["report", "--ledger", fresh_pg, "--by", "replica", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [(g["replica"], g["requests"]) for g in doc["groups"]] == [("east", 4), ("west", 1)]
    assert "postgres@" not in doc["ledger"]  # the URL's user part is not echoed


def test_report_says_why_when_the_database_is_unreachable(tmp_path: Path) -> None:
    from tests.ledger_pg.pg_servers import free_port

    res = CliRunner().invoke(cli, ["report", "--ledger",
                                   f"postgresql://postgres@127.0.0.1:{free_port()}/x"])
    assert res.exit_code == 1 and "cannot read the ledger" in res.output
