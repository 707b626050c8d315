"""A Grafana dashboard for a fleet of prefixgate replicas, generated from code.

``prefixgate grafana > dashboard.json`` (or ``--out FILE``, :mod:`prefixgate.proxy.cli.grafana`) prints
it; the copy in the repository is ``docs/grafana/prefixgate.json`` (``prefixgate grafana --out
docs/grafana/prefixgate.json`` rewrites it, and a test checks it is current). Import it in Grafana and pick
the Prometheus data source that scrapes every replica's ``/metrics``
(:mod:`prefixgate.proxy.observe.metrics`).

Every query aggregates across replicas (``sum by (...)`` over ``rate`` / ``increase``), filtered by
the dashboard variables ``job``, ``instance``, ``route``, ``model`` and ``backend`` (multi-select,
default all), so one dashboard serves one replica or fifty. Rows: savings (net USD saved, cached
share against the unrewritten counterfactual, tokens by kind, cost by kind), latency (TTFT / TPOT
p50 / p95 / p99, proxy overhead), traffic and errors per route and model, cache breaks by kind,
and per-replica health (in-flight upstream responses, pool queue, event-loop lag).
"""

from __future__ import annotations

import json
import re
from typing import Any

UID = "prefixgate-fleet"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
SEL = 'job=~"$job", instance=~"$instance", route=~"$route", model=~"$model", ' \
      'backend=~"$backend"'
NODE = 'job=~"$job", instance=~"$instance"'  # process-wide gauges carry no route labels
INPUT = 'kind="input"'
METRIC_RE = re.compile(r"\b(prefixgate_[a-z0-9_]+)")


def _sel(extra: str = "") -> str:
    return "{" + SEL + (", " + extra if extra else "") + "}"


def _rate(metric: str, extra: str = "", by: str = "") -> str:
    agg = f"sum by ({by}) " if by else "sum "
    return f"{agg}(rate({metric}{_sel(extra)}{RATE}))"


def _quantile(q: float, metric: str, by: str = "") -> str:
    keys = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket{_sel()}{RATE})))"


def _panel(title: str, targets: list[tuple[str, str]], unit: str = "short", kind: str = "timeseries",
           stack: bool = False, description: str = "") -> dict[str, Any]:
    custom: dict[str, Any] = {}
    if kind == "timeseries":
        custom = {"drawStyle": "line", "fillOpacity": 30 if stack else 10,
                  "stacking": {"mode": "normal" if stack else "none"}}
    return {
        "type": kind, "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "targets": [{"datasource": DS, "expr": expr, "legendFormat": legend,
                     "refId": chr(ord("A") + i)} for i, (expr, legend) in enumerate(targets)],
    }


def _row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def _variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2,
            "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1}


def _savings_panels() -> list[dict[str, Any]]:
    net = (f"sum(increase(prefixgate_saved_usd_total{_sel()}[$__range])) - "
           f"sum(increase(prefixgate_overspent_usd_total{_sel()}[$__range]))")
    share = _rate("prefixgate_tokens_total", 'kind="cached"') + " / " + \
        _rate("prefixgate_tokens_total", 'kind="prompt"')
    cf_share = _rate("prefixgate_tokens_total", 'kind="unrewritten_cached"') + " / " + \
        _rate("prefixgate_tokens_total", 'kind="prompt"')
    return [
        _panel("Net input USD saved (range)", [(net, "saved")], "currencyUSD", "stat",
               description="saved - overspent against the client's own bodies, all replicas"),
        _panel("Input USD, as sent vs unrewritten (range)",
               [(f"sum(increase(prefixgate_cost_usd_total{_sel(INPUT)}[$__range]))", "as sent"),
                (f"sum(increase(prefixgate_unrewritten_input_cost_usd_total{_sel()}"
                 f"[$__range]))", "unrewritten")], "currencyUSD", "stat"),
        _panel("Cached share of prompt tokens", [(share, "cached (measured)"),
                                                 (cf_share, "unrewritten (counterfactual)")],
               "percentunit"),
        _panel("Prompt and output tokens/s by kind",
               [(_rate("prefixgate_tokens_total", by="kind"), "{{kind}}")], "short", stack=True),
        _panel("USD per hour by kind",
               [(_rate("prefixgate_cost_usd_total", by="kind") + " * 3600", "{{kind}}")],
               "currencyUSD", stack=True),
        _panel("Tokens pruned/s by route",
               [(_rate("prefixgate_tokens_total", 'kind="pruned"', "route"), "{{route}}")]),
    ]


def _latency_panels() -> list[dict[str, Any]]:
    def quantiles(metric: str) -> list[tuple[str, str]]:
        return [(_quantile(q, metric), f"p{int(q * 100)}") for q in (0.5, 0.95, 0.99)]

    return [
        _panel("TTFT p50 / p95 / p99", quantiles("prefixgate_ttft_seconds"), "s"),
        _panel("TPOT p50 / p95 / p99", quantiles("prefixgate_tpot_seconds"), "s"),
        _panel("TTFT p95 by route", [(_quantile(0.95, "prefixgate_ttft_seconds", "route"),
                                      "{{route}}")], "s"),
        _panel("Proxy overhead before the send (p50 / p99)",
               [(_quantile(q, "prefixgate_proxy_overhead_seconds"), f"p{int(q * 100)}")
                for q in (0.5, 0.99)], "s",
               description="parse + route + passes + bridge, per request"),
    ]


def _traffic_panels() -> list[dict[str, Any]]:
    errors = _rate("prefixgate_requests_total", 'status!="ok"') + " / " + \
        _rate("prefixgate_requests_total")
    return [
        _panel("Requests/s by route and model",
               [(_rate("prefixgate_requests_total", by="route, model"), "{{route}} {{model}}")],
               "reqps"),
        _panel("Error share", [(errors, "errors")], "percentunit"),
        _panel("Requests/s by status", [(_rate("prefixgate_requests_total", by="status"),
                                         "{{status}}")], "reqps", stack=True),
        _panel("Cache breaks by kind (per 5 min)",
               [(f"sum by (kind) (increase(prefixgate_cache_breaks_total{_sel()}[5m]))",
                 "{{kind}}")], "short", stack=True),
    ]


def _replica_panels() -> list[dict[str, Any]]:
    return [
        _panel("Requests/s per replica",
               [(_rate("prefixgate_requests_total", by="instance"), "{{instance}}")], "reqps"),
        _panel("Upstream responses in use",
               [(f"sum by (instance) (prefixgate_upstream_responses_in_use{{{NODE}}})",
                 "{{instance}}")]),
        _panel("Requests waiting for an upstream connection",
               [(f"sum by (instance) (prefixgate_upstream_pool_queued{{{NODE}}})",
                 "{{instance}}")]),
        _panel("Event-loop lag", [(f"max by (instance) (prefixgate_event_loop_lag_seconds"
                                   f"{{{NODE}}})", "{{instance}}")], "s"),
    ]


def _layout(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows one under another; panels 8 wide (stats 6), 3 per line."""
    out: list[dict[str, Any]] = []
    y = 0
    for title, panels in rows:
        row = _row(title)
        row["gridPos"] = {"x": 0, "y": y, "w": 24, "h": 1}
        out.append(row)
        y += 1
        x = 0
        for p in panels:
            w = 8
            if x + w > 24:
                x, y = 0, y + 8
            p["gridPos"] = {"x": x, "y": y, "w": w, "h": 8}
            x += w
        y += 8
        out.extend(panels)
    for i, p in enumerate(out, 1):
        p["id"] = i
    return out


def dashboard() -> dict[str, Any]:
    """The dashboard JSON model (Grafana schemaVersion 39)."""
    label_query = "label_values(prefixgate_requests_total{job=~\"$job\"}, %s)"
    return {
        "uid": UID, "title": "prefixgate fleet", "tags": ["prefixgate", "llm", "prefix-cache"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "",
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            _variable("job", "label_values(prefixgate_requests_total, job)", "job"),
            _variable("instance", label_query % "instance", "replica"),
            _variable("route", label_query % "route", "route"),
            _variable("model", label_query % "model", "model"),
            _variable("backend", label_query % "backend", "backend"),
        ]},
        "panels": _layout([("Savings", _savings_panels()), ("Latency", _latency_panels()),
                           ("Traffic and cache breaks", _traffic_panels()),
                           ("Replicas", _replica_panels())]),
    }


def expressions(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression in ``dash``: panel targets and variable queries."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v.get("type") == "query":
            exprs.append(v["definition"])
    return exprs


def metrics_referenced(expr: str) -> set[str]:
    """The ``prefixgate_*`` sample names an expression reads."""
    return set(METRIC_RE.findall(expr))


def render() -> str:
    """The dashboard as indented JSON text (what ``docs/grafana/prefixgate.json`` holds)."""
    return json.dumps(dashboard(), indent=2) + "\n"
