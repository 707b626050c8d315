"""``prefixgate serve --workers N``: N proxy processes on one port, one ledger file holding every
worker's rows (SQLite WAL), flushed when the server stops."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from tests.paths import REPO
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_app_from_env_builds_the_policys_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    from prefixgate.proxy.cli import serve as cmd_serve

    policy = tmp_path / "p.yaml"
    policy.write_text("backends: {e: {kind: openai_compat, base_url: 'http://h/v1'}}\n"
                      "routes: [{match: '*', backend: e}]\n"
                      f"ledger: {{path: '{tmp_path / 'l.sqlite'}'}}\n"
                      "limits: {header_timeout_s: 3}\n")
    monkeypatch.setenv(cmd_serve.POLICY_ENV, str(policy))
    app = cmd_serve.app_from_env()
    assert sorted(app.state.proxy.policy.backends) == ["e"]  # type: ignore[attr-defined]
    assert cmd_serve.WorkerProtocol.header_timeout_s == 3  # type: ignore[attr-defined]


@pytest.mark.slow
def test_two_workers_share_one_ledger(tmp_path: Path) -> None:
    up = ScriptedUpstream(script=Script(body=completion()))
    port = _port()
    ledger = tmp_path / "ledger.sqlite"
    with serve_app(up.app()) as up_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            f"backends: {{e: {{kind: openai_compat, base_url: '{up_url}/v1'}}}}\n"
            "routes: [{match: '*', backend: e}]\n"
            f"ledger: {{path: '{ledger}'}}\nrewrite: {{enabled: false}}\n")
        proc = subprocess.Popen([sys.executable, "-m", "prefixgate.proxy.cli", "serve", "--policy",
                                 str(policy), "--port", str(port), "--workers", "2",
                                 "--log-level", "warning"], cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, "prefixgate serve exited"
                assert time.monotonic() < deadline, "prefixgate serve did not come up"
                time.sleep(0.2)
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

            def ask(_: int) -> int:
                with httpx.Client(timeout=30) as c:  # a new connection: any worker may take it
                    return c.post(url + "/v1/chat/completions", json=body).status_code

            with ThreadPoolExecutor(8) as pool:
                assert set(pool.map(ask, range(40))) == {200}
            assert len(_children(proc.pid)) >= 2  # uvicorn's worker processes
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    rows = Ledger(ledger).rows()
    assert len(rows) == 40 and {r["status"] for r in rows} == {"ok"}
