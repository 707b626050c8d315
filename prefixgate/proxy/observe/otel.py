"""OpenTelemetry export with the GenAI semantic conventions, over OTLP/HTTP (protobuf).

On only when the standard variables name a collector: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (traces
and metrics), or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
(that signal only); ``OTEL_SDK_DISABLED=true`` turns it off. The SDK reads the rest itself
(``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_METRIC_EXPORT_INTERVAL``). Off, nothing of OpenTelemetry is
imported: :func:`telemetry_from_env` returns None and the proxy's hot path has one ``is None``.
The SDK is the optional extra ``pip install prefixgate[otel]``; when it is missing the proxy
logs a warning and runs without export.

Per request (from its ledger row, after the answer), names from the GenAI semantic conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/, status Development, read 2026-12-01):

* a span ``chat {model}``, kind CLIENT, from the request's arrival to its end, with
  ``gen_ai.operation.name`` = ``chat``, ``gen_ai.provider.name`` (and the older
  ``gen_ai.system``), ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens`` (all input tokens, cache reads and writes included, as the
  convention asks), ``gen_ai.usage.output_tokens``, ``gen_ai.usage.cache_read.input_tokens``,
  ``gen_ai.usage.cache_creation.input_tokens``, ``http.response.status_code``, ``error.type``
  (the ledger status) and ``prefixgate.*`` (route, backend, edit summary, tokens pruned, the
  counterfactual cached tokens, proxy overhead). Never prompt text, keys or the session id (only
  its hash). A count the backend did not report is left out, never sent as 0.
* metrics ``gen_ai.client.token.usage`` ({token}, ``gen_ai.token.type`` = ``input`` /
  ``output``), ``gen_ai.client.operation.duration`` (s), ``gen_ai.server.time_to_first_token``
  (s) and ``gen_ai.server.time_per_output_token`` (s), with the convention's bucket boundaries,
  attributes ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.response.model`` — model values bounded by :class:`prefixgate.proxy.observe.metrics.LabelGuard`.

Bounds (issue 20, class 5): every string attribute and the span name are clipped to
:data:`~prefixgate.proxy.core.bounded.ATTR_CHARS` characters here
(:func:`~prefixgate.proxy.core.bounded.clip`), and the tracer provider's own ``SpanLimits``
hold the same bound for any attribute set elsewhere; metric attributes take their model values
from the label vocabulary, never from a client's text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.bounded import ATTR_CHARS, clip, encodable
from prefixgate.proxy.observe.metrics import OTHER, LabelGuard, RequestObs, label_vocabulary

log = logging.getLogger("prefixgate.otel")

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
# Bucket boundaries the GenAI metrics conventions recommend.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
MAX_ATTR_CHARS = ATTR_CHARS


def telemetry_from_env(policy: Policy, environ: Mapping[str, str] | None = None
                       ) -> GenAITelemetry | None:
    """A :class:`GenAITelemetry` when the environment names an OTLP endpoint (module
    docstring), else None — without importing OpenTelemetry. None too, with a warning, when the
    SDK is not installed."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    traces = bool(env.get(ENDPOINT) or env.get(TRACES_ENDPOINT))
    metrics = bool(env.get(ENDPOINT) or env.get(METRICS_ENDPOINT))
    if not (traces or metrics):
        return None
    try:
        return GenAITelemetry(policy, traces=traces, metrics=metrics)
    except ImportError as e:
        log.warning("OTEL_EXPORTER_OTLP_* is set but OpenTelemetry is not installed (%s): "
                    "pip install 'prefixgate[otel]'; running without export", e.name)
        return None


def _clip(text: str) -> str:
    """``text`` bounded for a span (:func:`~prefixgate.proxy.core.bounded.clip`, encodable)."""
    return encodable(clip(text, MAX_ATTR_CHARS))


class GenAITelemetry:
    """Tracer and meter providers of one proxy app, exporting over OTLP/HTTP.

    ``traces`` / ``metrics``: which signals to export (endpoints from the environment).
    Raises ImportError when the OpenTelemetry SDK or its OTLP/HTTP exporter is missing.
    """

    def __init__(self, policy: Policy, *, traces: bool = True, metrics: bool = True) -> None:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        self.kinds = {name: b.kind for name, b in policy.backends.items()}
        self.guard = LabelGuard(label_vocabulary(policy))
        attrs: dict[str, Any] = {}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attrs[SERVICE_NAME] = "prefixgate"
        resource = Resource.create(attrs)
        self.tracer_provider: Any = None
        self.meter_provider: Any = None
        self.tracer: Any = None
        if traces:
            self._start_traces(resource)
        if metrics:
            self._start_metrics(resource)

    def _start_traces(self, resource: Any) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        limits = SpanLimits(max_span_attribute_length=MAX_ATTR_CHARS,
                            max_attribute_length=MAX_ATTR_CHARS)
        self.tracer_provider = TracerProvider(resource=resource, span_limits=limits)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.tracer_provider.get_tracer("prefixgate")

    def _start_metrics(self, resource: Any) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        views = [View(instrument_name=name,
                      aggregation=ExplicitBucketHistogramAggregation(list(bounds)))
                 for name, bounds in (("gen_ai.client.token.usage", TOKEN_BUCKETS),
                                      ("gen_ai.client.operation.duration", DURATION_BUCKETS),
                                      ("gen_ai.server.time_to_first_token", TTFT_BUCKETS),
                                      ("gen_ai.server.time_per_output_token", TPOT_BUCKETS))]
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader],
                                            views=views)
        meter = self.meter_provider.get_meter("prefixgate")
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration")
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s",
            description="Time to generate first token for successful responses")
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Time per output token generated after the first token")

    def provider(self, backend: str) -> str:
        """``gen_ai.provider.name`` of a backend (``unknown`` when the request had none)."""
        kind = self.kinds.get(backend)
        return traits(kind).otel_provider if kind else "unknown"

    def observe(self, row: LedgerRow, obs: RequestObs | None = None) -> None:
        """Export one finished request: its span and its metric points."""
        obs = obs or RequestObs()
        if self.tracer is not None:
            self._span(row, obs)
        if self.meter_provider is not None:
            self._points(row, obs)

    def _span(self, row: LedgerRow, obs: RequestObs) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        provider = self.provider(row.backend)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
            "gen_ai.system": provider, "gen_ai.request.model": _clip(row.model),
            "http.response.status_code": row.http_status,
            "prefixgate.route": _clip(row.route), "prefixgate.backend": _clip(row.backend),
            "prefixgate.status": _clip(row.status), "prefixgate.stream": row.stream,
            "prefixgate.edits": _clip(row.edits), "prefixgate.tokens_pruned": row.tokens_pruned,
            "prefixgate.session_hash": _clip(row.session),
        }
        optional = {
            "gen_ai.response.model": obs.response_model,
            "gen_ai.usage.input_tokens": row.prompt_tokens,
            "gen_ai.usage.output_tokens": row.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": row.cached_tokens,
            "gen_ai.usage.cache_creation.input_tokens": row.cache_write_tokens,
            "prefixgate.unrewritten_cached_tokens": row.cf_cached_tokens,
            "prefixgate.ttft_ms": row.ttft_ms, "prefixgate.tpot_ms": row.tpot_ms,
            "prefixgate.input_usd": row.input_usd, "prefixgate.unrewritten_input_usd":
                row.cf_input_usd,
            "prefixgate.proxy_overhead_ms": None if obs.overhead_s is None else
                obs.overhead_s * 1e3,
        }
        attrs.update({k: (_clip(v) if isinstance(v, str) else v)
                      for k, v in optional.items() if v is not None})
        if row.status != "ok":
            attrs["error.type"] = _clip(row.status)
        start_ns = int(row.ts * 1e9)
        end_ns = start_ns + int((row.total_ms or 0.0) * 1e6)
        span = self.tracer.start_span(_clip(f"chat {row.model}".strip()), kind=SpanKind.CLIENT,
                                      attributes=attrs, start_time=start_ns)
        if row.status != "ok":
            span.set_status(Status(StatusCode.ERROR, _clip(row.status)))
        span.end(end_time=end_ns)

    def _points(self, row: LedgerRow, obs: RequestObs) -> None:
        _, model, _ = self.guard.labels(row.route, row.model, row.backend)
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat",
                                 "gen_ai.provider.name": self.provider(row.backend),
                                 "gen_ai.request.model": model}
        if obs.response_model:
            answered = self.guard.labels(row.route, obs.response_model, row.backend)[1]
            attrs["gen_ai.response.model"] = answered if answered != OTHER else model
        if row.status != "ok":
            attrs["error.type"] = _clip(row.status)
        if row.prompt_tokens is not None:
            self.token_usage.record(row.prompt_tokens, {**attrs, "gen_ai.token.type": "input"})
        if row.output_tokens is not None:
            self.token_usage.record(row.output_tokens, {**attrs, "gen_ai.token.type": "output"})
        if row.total_ms is not None:
            self.duration.record(row.total_ms / 1e3, attrs)
        if row.status == "ok" and row.ttft_ms is not None:
            self.ttft.record(row.ttft_ms / 1e3, attrs)
        if row.status == "ok" and row.tpot_ms is not None:
            self.tpot.record(row.tpot_ms / 1e3, attrs)

    def force_flush(self, timeout_ms: int = 10_000) -> None:
        """Export everything recorded so far (tests, shutdown)."""
        for p in (self.tracer_provider, self.meter_provider):
            if p is not None:
                p.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Flush and stop the exporters; never raises."""
        for p in (self.tracer_provider, self.meter_provider):
            try:
                if p is not None:
                    p.shutdown()
            except Exception:  # noqa: BLE001 - shutting down must not fail the app's shutdown
                log.exception("OpenTelemetry shutdown failed")
