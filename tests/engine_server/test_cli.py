"""``python -m prefixgate.local_engine`` as the proxy spawns it: a real process serving the tiny model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_module_entry_point_serves_openai_api(tiny_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "engine.log"
    cmd = [sys.executable, "-m", "prefixgate.local_engine", "--model", str(tiny_dir), "--port", str(port),
           "--num-kv-slots", "2048", "--max-context-len", "256", "--model-name", "tiny-cli",
           "--threads", "1", "--log-level", "warning"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=out, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "engine did not come up"
            time.sleep(0.3)
        models = httpx.get(base + "/v1/models").json()["data"]
        assert models[0]["id"] == "tiny-cli" and models[0]["max_model_len"] == 256
        body = {"model": "tiny-cli", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3}
        answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
        assert 1 <= answer["usage"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode in (0, -15)
