"""``prefixgate serve`` spawns the local engine as a subprocess, proxies to it, and stops it."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefixgate.config.schema import Backend
from prefixgate.proxy.cli.engine_proc import engine_address, engine_command, health_url
from tests.paths import REPO
from tests.tiny_model import make_tiny_model_dir


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_engine_address_and_command_come_from_the_backend() -> None:
    b = Backend(kind="local", base_url="http://127.0.0.1:9123/v1", spawn=True)
    assert engine_address(b) == ("127.0.0.1", 9123)
    assert health_url(b) == "http://127.0.0.1:9123/health"
    cmd = engine_command("/m", "127.0.0.1", 9123, "cpu")
    assert cmd[1:] == ["-m", "prefixgate.local_engine", "--model", "/m", "--host", "127.0.0.1",
                       "--port", "9123", "--device", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_serve_spawns_the_engine_proxies_and_stops_it(tmp_path: Path, stop: int) -> None:
    # SIGTERM (kill, systemd, docker stop) once left the spawned engine running: uvicorn raises
    # the signal again after its own shutdown, and SIGTERM's default action does not unwind
    tiny = make_tiny_model_dir(tmp_path / "tiny")
    proxy_port, engine_port = _port(), _port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"listen: {{host: 127.0.0.1, port: {proxy_port}}}\n"
        f"backends:\n  local: {{kind: local, base_url: 'http://127.0.0.1:{engine_port}/v1', "
        f"spawn: true, model_path: '{tiny}'}}\n"
        "routes:\n  - {match: '*', backend: local}\n"
        f"ledger: {{path: '{tmp_path / 'ledger.sqlite'}'}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy", str(policy),
                             "--log-level", "warning"], cwd=REPO)
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "prefixgate serve exited"
            assert time.monotonic() < deadline, "prefixgate serve did not come up"
            time.sleep(0.3)
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "anything", "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        ids = [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]]
        assert ids  # the engine's model, asked live
    finally:
        proc.send_signal(stop)
        code = proc.wait(timeout=60)
    if stop == signal.SIGTERM:  # dies by the signal after unwinding: a clean stop to systemd
        assert code == -signal.SIGTERM
    with pytest.raises(httpx.HTTPError):  # the spawned engine is gone too
        httpx.get(f"http://127.0.0.1:{engine_port}/health", timeout=2)


def test_engine_command_execs_the_engine_with_extra_flags(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from typer.testing import CliRunner

    from prefixgate.proxy.cli import app
    from prefixgate.proxy.cli import serve as cmd_serve

    calls: list[list[str]] = []
    monkeypatch.setattr(cmd_serve.os, "execv", lambda path, argv: calls.append(argv))
    res = CliRunner().invoke(app, ["engine", "--model", "/m", "--port", "9000",
                                   "--disable-prefix-cache"])
    assert res.exit_code == 0, res.output
    assert calls[0][1:] == ["-m", "prefixgate.local_engine", "--model", "/m", "--host", "127.0.0.1",
                            "--port", "9000", "--device", "cpu", "--disable-prefix-cache"]
