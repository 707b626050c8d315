"""The fault suite, grown to the PostgreSQL ledger's writer (issue 34): every fault the link to the
database can throw — a hang (accepted, nothing forwarded: only a client-side deadline notices), a
reset (RST), a clean close — and a run of them in sequence, under live traffic through the proxy.
For each: every request is answered 200, ``/healthz`` says the ledger is down while the fault
lasts (and stays 200: the ledger alone never takes the proxy out), no row stays unacknowledged
in memory past the writer's deadline, and once the database answers again every row is recorded
exactly once with rollups that agree.

The database sits behind :class:`tests.faults.tcp_fault_proxy.TcpFaultProxy`; the machine's
PostgreSQL (``tests/ledger_pg`` fixtures) is never stopped."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.pg import PgLedger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.faults.tcp_fault_proxy import TcpFaultProxy, fault_proxy
from tests.ledger_pg.conftest import fresh_pg, pg_admin  # noqa: F401  (fixtures)
from tests.ledger_pg.test_pg_hang import recorded, until, via
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
WRITE_TIMEOUT_S = 2.0


@dataclass
class WriterRig:
    """``url``: the proxy; ``db``: the fault proxy in front of PostgreSQL; ``ledger``."""

    url: str
    db: TcpFaultProxy
    ledger: PgLedger
    client: httpx.Client

    def send(self, n: int) -> list[int]:
        return [self.client.post(self.url + "/v1/chat/completions", json=BODY).status_code
                for _ in range(n)]

    def health(self) -> tuple[int, dict[str, Any]]:
        r = self.client.get(self.url + "/healthz")
        return r.status_code, r.json()["ledger"]


@pytest.fixture
def rig(fresh_pg: str, tmp_path: Path) -> Iterator[WriterRig]:  # noqa: F811
    port = int(fresh_pg.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    up = ScriptedUpstream(script=Script(body=completion()))
    with fault_proxy("127.0.0.1", port) as db, serve_app(up.app()) as up_url:
        led = PgLedger(via(fresh_pg, db), spool_path=tmp_path / "spool.sqlite", retry_s=0.2,
                       write_timeout_s=WRITE_TIMEOUT_S)
        policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                                  "base_url": f"{up_url}/v1"}},
                               "routes": [{"match": "*", "backend": "e"}],
                               "rewrite": {"enabled": False}})
        with serve_app(build_app(policy, ledger=led, analyze=False)) as url, \
                httpx.Client(timeout=30) as client:
            yield WriterRig(url, db, led, client)
        led.close()


def through_fault(rig: WriterRig, fault: str, n: int) -> None:
    """Serve ``n`` requests while ``fault`` holds; check what the proxy says meanwhile."""
    rig.db.set_mode(fault)
    assert rig.send(n) == [200] * n
    assert until(lambda: rig.health()[1]["up"] is False), f"/healthz said up during {fault}"
    assert until(lambda: rig.health()[1]["queued"] == 0), f"rows stuck in memory during {fault}"
    status, st = rig.health()
    assert status == 200 and st["spooled_rows"] >= n and st["last_error"], st


def recovered(rig: WriterRig) -> None:
    rig.db.set_mode("pass")
    assert until(lambda: rig.health()[1]["spooled_rows"] == 0), rig.health()
    assert until(lambda: rig.health()[1]["up"] is True), rig.health()


@pytest.mark.parametrize("fault", ["hang", "reset", "close"])
def test_a_database_fault_under_traffic_loses_no_row_and_records_each_once(
        rig: WriterRig, fresh_pg: str, fault: str) -> None:  # noqa: F811
    assert rig.send(10) == [200] * 10
    assert until(lambda: recorded(fresh_pg) == (10, 10))
    through_fault(rig, fault, 10)
    recovered(rig)
    assert rig.send(5) == [200] * 5
    # acknowledged may mean spooled (a commit past the deadline on a loaded machine): wait for
    # the rows to reach the database, then count them
    assert until(lambda: recorded(fresh_pg)[0] >= 25)
    assert recorded(fresh_pg) == (25, 25)
    assert sum(r["data"]["requests"] for r in rig.ledger.rollups(0, 4e9)) == 25


def test_faults_in_sequence_lose_no_row_and_record_each_once(rig: WriterRig,
                                                             fresh_pg: str) -> None:  # noqa: F811
    total = 0
    for fault in ("hang", "reset", "hang", "close"):
        assert rig.send(4) == [200] * 4
        through_fault(rig, fault, 6)
        total += 10
        recovered(rig)
    assert until(lambda: recorded(fresh_pg)[0] >= total)
    assert recorded(fresh_pg) == (total, total)
    assert sum(r["data"]["requests"] for r in rig.ledger.rollups(0, 4e9)) == total
