"""What the proxy measures and shows (layer 5): Prometheus metrics, OpenTelemetry, health, cache-break
insight and the counterfactual, the dashboard, the savings API, the Grafana dashboard.
"""
