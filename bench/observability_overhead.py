"""What observability costs per request: :meth:`prefixgate.proxy.observe.metrics.ProxyMetrics.observe` (Prometheus)
and :meth:`prefixgate.proxy.observe.otel.GenAITelemetry.observe` (one span + the GenAI metric points), in
microseconds, each run on the event loop once per finished request.

    python bench/observability_overhead.py [--n 1000] [--out bench/results/observability_overhead.json]

The OTLP exporters point at a local port nobody listens on and are never flushed inside the
timed loop (``n`` stays under the span queue's 2,048, so no span is dropped): what is timed is the
work on the request's path, not the background export.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.result_file import command, write_json  # noqa: E402
from prefixgate.cache.ledger.store import LedgerRow  # noqa: E402
from prefixgate.config.loader import parse_policy  # noqa: E402
from prefixgate.proxy.observe.metrics import ProxyMetrics, RequestObs  # noqa: E402


def rows(n: int) -> list[tuple[LedgerRow, RequestObs]]:
    out = []
    for i in range(n):
        row = LedgerRow(route="gpt-*", model=f"gpt-4o{'-mini' if i % 3 else ''}", backend="up",
                        prompt_tokens=4000 + i, cached_tokens=3000, output_tokens=120,
                        ttft_ms=300.0, tpot_ms=20.0, total_ms=2700.0, input_usd=0.004,
                        cf_input_usd=0.009, cf_cached_tokens=0, session=f"s{i % 50}",
                        edits="canonicalize_tools;hoist_volatile")
        out.append((row, RequestObs(read_done=1.0, sent_at=1.003, response_model="gpt-4o",
                                    break_kind="system_edit" if i % 10 == 0 else None)))
    return out


def time_us(fn, items) -> dict[str, float]:  # type: ignore[no-untyped-def]
    samples = []
    for row, obs in items:
        t = time.perf_counter()
        fn(row, obs)
        samples.append((time.perf_counter() - t) * 1e6)
    samples.sort()
    return {"p50_us": round(statistics.median(samples), 1),
            "p95_us": round(samples[int(len(samples) * 0.95)], 1),
            "mean_us": round(statistics.fmean(samples), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", default="bench/results/observability_overhead.json")
    args = ap.parse_args()
    policy = parse_policy({"backends": {"up": {"kind": "openai", "base_url": "http://x/v1"}},
                           "routes": [{"match": "gpt-*", "backend": "up"}]})
    prom = ProxyMetrics()
    figures = {"prometheus_observe": time_us(prom.observe, rows(args.n))}
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "3600000"
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "3600000"
    from prefixgate.proxy.observe.otel import telemetry_from_env

    otel = telemetry_from_env(policy)
    assert otel is not None, "pip install 'prefixgate[otel]'"
    figures["otel_observe"] = time_us(otel.observe, rows(min(args.n, 2000)))
    figures["n"] = args.n
    result = {"command": command(__file__), "figures": figures}
    write_json(args.out, result)
    print(json.dumps(result, indent=2))
    os._exit(0)  # skip the exporters' shutdown retries against the dead port


if __name__ == "__main__":
    main()
