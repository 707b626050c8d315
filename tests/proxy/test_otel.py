"""OpenTelemetry export (:mod:`prefixgate.proxy.observe.otel`): an in-test OTLP/HTTP receiver gets each request's
span and the GenAI metrics, parsed with opentelemetry-proto's protobuf classes; without the
``OTEL_EXPORTER_OTLP_*`` variables nothing of the SDK is even imported."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from prefixgate.cache.ledger.store import Ledger  # noqa: E402
from prefixgate.proxy.app import build_app
from prefixgate.proxy.observe.otel import telemetry_from_env  # noqa: E402
from tests.proxy.conftest import make_policy  # noqa: E402
from tests.proxy.upstream import DONE, Script, chunk, completion, wait_rows  # noqa: E402
from tests.servers import serve_app  # noqa: E402

SECRET_TEXT = "my-passport-number-X9Q7"
CLIENT_KEY = "sk-client-SECRET-4711"


class Receiver:
    """Collects OTLP/HTTP POST bodies by path (``/v1/traces``, ``/v1/metrics``)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                rec.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        out = []
        for path, body in self.posts:
            if path == "/v1/traces":
                req = ExportTraceServiceRequest.FromString(body)
                out += [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        return out

    def metrics(self) -> dict[str, list[Any]]:
        """Histogram points of the newest export (cumulative: it holds every earlier one)."""
        out: dict[str, list[Any]] = {}
        newest = [body for path, body in self.posts if path == "/v1/metrics"][-1:]
        for body in newest:
            req = ExportMetricsServiceRequest.FromString(body)
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.setdefault(m.name, []).extend(m.histogram.data_points)
        return out


def attrs(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValues -> {key: python value}."""
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def test_span_and_genai_metrics_reach_the_otlp_receiver(
        receiver: Receiver, upstream: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    up, up_url = upstream
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only our flush exports
    monkeypatch.setenv("PG_TEST_ANTHROPIC_KEY", "sk-ant-backend-KEY")
    policy = make_policy(up_url, tmp_path / "ledger.sqlite")
    ledger = Ledger(policy.ledger.path)
    app = build_app(policy, ledger=ledger, rewrite_fn=None)
    otel = app.state.proxy.otel
    assert otel is not None
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": SECRET_TEXT}]}
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    with serve_app(app) as url:
        up.script = Script(body=completion())  # prompt 10, cached 4, output 2, model "m"
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=auth).status_code == 200
        up.script = Script(pieces=[chunk("a"), chunk("b"), chunk("c"), chunk(finish="stop"),
                                   chunk(usage={"prompt_tokens": 7, "completion_tokens": 3}),
                                   DONE])
        r = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, headers=auth)
        assert r.status_code == 200
        wait_rows(ledger, 2)
        otel.force_flush()

    spans = receiver.spans()
    assert len(spans) == 2
    by_tokens = {attrs(s.attributes)["gen_ai.usage.input_tokens"]: s for s in spans}
    plain = by_tokens[10]
    a = attrs(plain.attributes)
    assert plain.name == "chat gpt-4o"
    assert plain.kind == 3  # SPAN_KIND_CLIENT
    assert plain.end_time_unix_nano > plain.start_time_unix_nano
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai_compatible"
    assert a["gen_ai.request.model"] == "gpt-4o"
    assert a["gen_ai.response.model"] == "m"
    assert a["gen_ai.usage.output_tokens"] == 2
    assert a["gen_ai.usage.cache_read.input_tokens"] == 4
    assert "gen_ai.usage.cache_creation.input_tokens" not in a  # not reported: left out
    assert a["prefixgate.route"] == "gpt-*"
    streamed = attrs(by_tokens[7].attributes)
    assert streamed["gen_ai.response.model"] == "m"  # read from the stream's chunks
    assert streamed["gen_ai.usage.output_tokens"] == 3

    points = receiver.metrics()
    usage: dict[str, int] = {}
    for p in points["gen_ai.client.token.usage"]:
        kind = attrs(p.attributes)["gen_ai.token.type"]
        usage[kind] = usage.get(kind, 0) + int(p.sum)
    assert usage == {"input": 17, "output": 5}
    first = points["gen_ai.client.token.usage"][0]
    assert attrs(first.attributes)["gen_ai.request.model"] == "gpt-4o"
    assert attrs(first.attributes)["gen_ai.provider.name"] == "openai_compatible"
    assert sum(p.count for p in points["gen_ai.server.time_to_first_token"]) == 1  # the stream
    assert sum(p.count for p in points["gen_ai.server.time_per_output_token"]) == 1
    assert sum(p.count for p in points["gen_ai.client.operation.duration"]) == 2

    everything = b"".join(b for _, b in receiver.posts)
    assert SECRET_TEXT.encode() not in everything
    assert CLIENT_KEY.encode() not in everything
    assert b"sk-ant-backend-KEY" not in everything


def test_only_the_named_signal_is_exported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    policy = make_policy("http://127.0.0.1:9", tmp_path / "l.sqlite")
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}
    t = telemetry_from_env(policy, env)
    assert t is not None and t.tracer is not None and t.meter_provider is None
    t.shutdown()
    assert telemetry_from_env(policy, {}) is None
    assert telemetry_from_env(policy, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x",
                                       "OTEL_SDK_DISABLED": "true"}) is None


def test_off_without_otlp_variables_imports_no_sdk(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tests.proxy.conftest import make_policy\n"
        "from prefixgate.proxy.app import build_app\n"
        f"app = build_app(make_policy('http://127.0.0.1:9', {str(tmp_path / 'l.sqlite')!r}),"
        " rewrite_fn=None)\n"
        "assert app.state.proxy.otel is None\n"
        "bad = [m for m in sys.modules if m.startswith(('opentelemetry.sdk',"
        " 'opentelemetry.exporter'))]\n"
        "assert not bad, bad\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_megabyte_client_strings_are_clipped_in_spans_and_points(
        receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20, class 5: 1 MB model names made 3 MB exports. Called on the sink itself (not
    through ProxyState.record, which clips the row first), so the exporter's own bound is what
    is tested; the response model and the error status are long too (not in the issue)."""
    from prefixgate.cache.ledger.store import LedgerRow
    from prefixgate.proxy.core.bounded import ATTR_CHARS
    from prefixgate.proxy.observe.metrics import OTHER, RequestObs

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    policy = make_policy("http://127.0.0.1:9", tmp_path / "l.sqlite")
    otel = telemetry_from_env(policy)
    assert otel is not None
    mb = 1024 * 1024
    for i in range(3):
        row = LedgerRow(route="m*", backend="up", model=f"m{i}" + "x" * mb, status="E" * mb,
                        http_status=502, edits="e" * mb, session="s" * mb, prompt_tokens=5,
                        output_tokens=1, total_ms=3.0)
        otel.observe(row, RequestObs(response_model="r" * mb))
    otel.force_flush()
    otel.shutdown()
    total = sum(len(b) for _, b in receiver.posts)
    assert total < 30_000, total
    spans = receiver.spans()
    assert len(spans) == 3
    for s in spans:
        assert len(s.name) <= ATTR_CHARS
        for v in attrs(s.attributes).values():
            assert not isinstance(v, str) or len(v) <= ATTR_CHARS
        assert len(s.status.message) <= ATTR_CHARS
    for points in receiver.metrics().values():
        for p in points:
            a = attrs(p.attributes)
            assert a["gen_ai.request.model"] == OTHER
            assert all(len(v) <= ATTR_CHARS for v in a.values() if isinstance(v, str))
