"""The local engine server, like the proxy, treats a client that goes away before its request
body is complete as a disconnect: no "request failed" traceback, no 500 counted as an engine
failure (no 500), and the next request is served normally."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app

    d = make_tiny_model_dir(tmp_path_factory.mktemp("tiny_adv"))
    eng = Engine(EngineConfig(model_path=str(d), num_kv_slots=1024, max_context_len=256,
                              model_name="tiny"))
    try:
        with serve_app(build_app(eng)) as url:
            yield url
    finally:
        eng.shutdown()


def test_engine_client_gone_mid_body_is_not_an_engine_failure(
        engine_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    u = urlsplit(engine_url)
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                  b'{"model": "tiny", "messages": [')
        time.sleep(0.2)
    time.sleep(0.5)
    r: Any = httpx.post(engine_url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert not [rec for rec in caplog.records if rec.exc_info], caplog.text
