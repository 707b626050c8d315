"""P/D split decisions read back from the ledger's ``deployment``: counted per route on the
dashboard's API, and on the report's "P/D:" line and JSON."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.pd_decisions import pd_decision, pd_summary
from prefixgate.cache.savings.summary import savings_document
from prefixgate.proxy.cli import app

DEPLOYMENTS = ["fleet/pd-split:split", "fleet/pd-colocate:prefix_hit",
               "fleet/pd-colocate:prefix_hit", "fleet/pd-colocate:prefill_failed"]


def test_a_rows_deployment_names_its_decision() -> None:
    assert pd_decision("fleet/pd-split:split") == ("split", "split")
    assert pd_decision("a/b/pd-colocate:short_uncached") == ("colocate", "short_uncached")
    assert pd_decision("openai-eu") is None and pd_decision(None) is None
    assert pd_decision("x/pd-other:y") is None


def test_the_summary_counts_decisions_and_reasons() -> None:
    got = pd_summary([{"deployment": d} for d in DEPLOYMENTS] + [{"deployment": "plain"}])
    assert got == {"split": 1, "colocate": 3, "split_share": 0.25,
                   "reasons": {"colocate:prefill_failed": 1, "colocate:prefix_hit": 2,
                               "split:split": 1}}
    assert pd_summary([{"deployment": "plain"}]) is None


def _ledger(path: Path) -> None:
    led = Ledger(path)
    now = time.time()
    for i, d in enumerate(DEPLOYMENTS):
        led.write(LedgerRow(ts=now - 10 + i, route="pd", backend="fleet", model="m",
                            deployment=d, prompt_tokens=100, output_tokens=5))
    led.write(LedgerRow(ts=now - 5, route="plain", backend="b", model="m", prompt_tokens=9,
                        output_tokens=1))
    led.close()


def test_the_dashboard_api_gives_each_route_its_split_share(tmp_path: Path) -> None:
    _ledger(tmp_path / "l.db")
    doc = savings_document(Ledger(tmp_path / "l.db"), "1h")
    by = {r["route"]: r for r in doc["routes"]}
    assert by["pd"]["pd_split_share"] == 0.25 and by["pd"]["pd"]["split"] == 1
    assert by["plain"]["pd"] is None and by["plain"]["pd_split_share"] is None


def test_the_report_prints_and_returns_the_decisions(tmp_path: Path) -> None:
    _ledger(tmp_path / "l.db")
    res = CliRunner().invoke(app, ["report", "--ledger", str(tmp_path / "l.db"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["pd"]["colocate"] == 3
    res = CliRunner().invoke(app, ["report", "--ledger", str(tmp_path / "l.db")],
                             env={"COLUMNS": "200"})
    assert "P/D: split 1 · colocated 3 (25.0% split;" in res.output
