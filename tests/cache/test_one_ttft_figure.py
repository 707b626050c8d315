"""One definition of the TTFT figures (issue 37, item 5): the report's headline TTFT p50, its
route rows, and ``/api/savings``' totals, routes and replicas agree on the same requests."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.report import group_figures, saved_figures
from prefixgate.cache.savings.summary import savings_document
from prefixgate.proxy.cli import app


def _ledger(tmp_path: Path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    for ttft in (40.0, 50.0, 60.0):
        led.write(LedgerRow(route="local", backend="engine", model="m", prompt_tokens=100,
                            cached_tokens=10, ttft_ms=ttft))
    # a stream that broke after its first token: it has a TTFT, and it is not "ok"
    led.write(LedgerRow(route="local", backend="engine", model="m", ttft_ms=20.0,
                        status="upstream_error", http_status=502))
    return led


def test_the_headline_ttft_p50_is_the_route_rows(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    rows = led.rows()
    headline = saved_figures(rows)["ttft_p50_ms"]
    (route,) = group_figures(rows, "route")
    assert headline == route["ttft_p50_ms"] == 45.0
    doc = savings_document(led, "7d")
    assert doc["totals"]["ttft_p50_ms"] == doc["routes"][0]["ttft_p50_ms"] == headline
    assert doc["replicas"][0]["ttft_p50_ms"] == headline
    res = CliRunner().invoke(app, ["report", "--ledger", led.path, "--json"])
    out = json.loads(res.output)
    assert out["saved"]["ttft_p50_ms"] == out["groups"][0]["ttft_p50_ms"] == headline
