"""The Grafana dashboard (:mod:`prefixgate.proxy.observe.grafana`): valid JSON, current in the repository, and every
PromQL expression reads only metrics the proxy exports."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.observe.grafana import dashboard, expressions, metrics_referenced, render
from prefixgate.proxy.observe.metrics import ProxyMetrics

ROOT = Path(__file__).resolve().parents[2]


def exported_names() -> set[str]:
    m = ProxyMetrics()
    m.watch_resources(lambda: 0, lambda: {}, lambda: 0.0)
    return m.metric_names()


def test_every_expression_reads_an_exported_metric() -> None:
    names = exported_names()
    exprs = expressions(dashboard())
    assert len(exprs) >= 20
    for expr in exprs:
        used = metrics_referenced(expr)
        assert used, f"no prefixgate metric in {expr!r}"
        assert used <= names, f"{expr!r} reads {sorted(used - names)}"
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")


def test_histogram_quantiles_read_buckets_and_counters_are_rated() -> None:
    for expr in expressions(dashboard()):
        if "histogram_quantile" in expr:
            assert "_bucket{" in expr and "by (le" in expr
        for name in metrics_referenced(expr):
            if name.endswith("_total") and not expr.startswith("label_values("):
                assert f"rate({name}" in expr or f"increase({name}" in expr, expr


def test_committed_json_is_valid_and_current() -> None:
    committed = (ROOT / "docs" / "grafana" / "prefixgate.json").read_text()
    parsed = json.loads(committed)
    assert parsed == dashboard()
    assert committed == render()
    ids = [p["id"] for p in parsed["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in parsed["templating"]["list"]}
    assert {"datasource", "job", "instance", "route", "model", "backend"} <= variables


def test_cli_prints_the_dashboard() -> None:
    res = CliRunner().invoke(cli, ["grafana"])
    assert res.exit_code == 0
    assert json.loads(res.output)["uid"] == dashboard()["uid"]
