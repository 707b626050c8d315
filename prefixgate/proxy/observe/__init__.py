"""What the proxy measures and shows (layer 5): Prometheus metrics, OpenTelemetry, health, cache-break
insight and the counterfactual, the dashboard, the savings API, the Grafana dashboard.
"""

from __future__ import annotations

from prefixgate.proxy.observe.insight import Analysis, Insight
from prefixgate.proxy.observe.metrics import ProxyMetrics

__all__ = ["Analysis", "Insight", "ProxyMetrics"]
