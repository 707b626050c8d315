"""What ``prefixgate serve`` says and where its engine listens (issue 37, items 4 and 7): the
spawned engine takes a random loopback port (the policy's 8081 answers nothing an SDK could
reach by mistake), the served policy points at it, and a ready banner names the proxy's URL for
each SDK, the dashboard and the report command."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import pytest

from prefixgate.config.loader import default_policy
from prefixgate.config.schema import Backend
from prefixgate.proxy.cli import engine_proc
from prefixgate.proxy.cli.serve import ready_lines, with_engine_urls

FAKE_ENGINE = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_spawned_engine_listens_on_a_random_loopback_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_proc, "engine_command", lambda model, host, port, device, extra: [
        sys.executable, "-c", FAKE_ENGINE, host, str(port)])
    configured = _free_port()
    b = Backend(kind="local", base_url=f"http://127.0.0.1:{configured}/v1", spawn=True)
    with engine_proc.EngineProcess(b, "/m", startup_timeout_s=60) as eng:
        assert eng.base_url.startswith("http://127.0.0.1:") and eng.base_url.endswith("/v1")
        port = int(eng.base_url.split(":")[2].split("/")[0])
        assert port != configured
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):  # nothing at the policy's address
            httpx.get(f"http://127.0.0.1:{configured}/health", timeout=2)
    served = with_engine_urls(default_policy(), {"local": eng.base_url})
    assert served.backends["local"].base_url == eng.base_url
    assert served.backends["openai"] == default_policy().backends["openai"]


def test_the_ready_banner_names_the_urls_and_the_report_command() -> None:
    lines = ready_lines("127.0.0.1", 8080, Path("my.yaml"), {"local": "http://127.0.0.1:40123/v1"})
    text = "\n".join(lines)
    assert lines[0].startswith("prefixgate ready: base_url http://127.0.0.1:8080/v1 (OpenAI SDK")
    assert "http://127.0.0.1:8080 (Anthropic SDK)" in lines[0]
    assert "dashboard http://127.0.0.1:8080/dashboard" in text
    assert "`prefixgate report --policy my.yaml`" in text
    assert "http://127.0.0.1:40123/v1 (the proxy's own" in text
    assert "0.0.0.0" not in "\n".join(ready_lines("0.0.0.0", 9090, None, {}))


@pytest.mark.slow
def test_serve_prints_one_format_a_banner_and_an_access_line(tmp_path: Path) -> None:
    import re
    import signal
    import subprocess
    import time

    from tests.paths import REPO
    from tests.tiny_model import make_tiny_model_dir

    tiny = make_tiny_model_dir(tmp_path / "tiny")
    proxy_port, engine_port = _free_port(), _free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"listen: {{host: 127.0.0.1, port: {proxy_port}}}\n"
        f"backends:\n  local: {{kind: local, base_url: 'http://127.0.0.1:{engine_port}/v1', "
        f"spawn: true, model_path: '{tiny}'}}\n"
        "routes:\n  - {match: '*', backend: local}\n"
        f"ledger: {{path: '{tmp_path / 'ledger.sqlite'}'}}\n")
    log_file = tmp_path / "serve.log"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy",
                                 str(policy)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        deadline = time.monotonic() + 300
        while "prefixgate ready" not in log_file.read_text(errors="replace"):
            assert proc.poll() is None, log_file.read_text(errors="replace")
            assert time.monotonic() < deadline, "no ready banner"
            time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # the policy's engine address answers nothing
            httpx.get(f"http://127.0.0.1:{engine_port}/v1/models", timeout=2)
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "anything", "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": "secret words"}]})
        assert r.status_code == 200
        deadline = time.monotonic() + 30
        while "prefixgate.access POST /v1/chat/completions 200" not in log_file.read_text():
            assert time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    text = log_file.read_text(errors="replace")
    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [\w.]+ ")
    lines = [x for x in text.splitlines() if x.strip() and not x.startswith("starting the local")]
    assert all(stamped.match(x) for x in lines), "\n".join(x for x in lines if not stamped.match(x))
    assert "Warning" not in text and "deprecated" not in text and "tenants:" not in text
    assert f"base_url {url}/v1 (OpenAI SDK" in text and f"{url}/dashboard" in text
    assert "secret words" not in text and "HTTP Request: GET" not in text  # no poll noise
