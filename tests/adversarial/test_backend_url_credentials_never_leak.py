"""A backend ``base_url`` carrying credentials (``http://user:secret@host/v1``) still works
(sent as HTTP Basic auth), but the secret never shows up in an error body, the ledger, or the
log (httpx logs each request's URL at INFO)."""

from __future__ import annotations

import base64
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

SECRET = "fake-url-password-42"  # a placeholder, not a key
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _proxy(base_url: str, tmp_path: Path) -> tuple[Any, Ledger]:
    policy = parse_policy({"backends": {"b": {"kind": "openai_compat", "base_url": base_url,
                                              "timeout_s": 2}},
                           "routes": [{"match": "*", "backend": "b"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite")}})
    ledger = Ledger(policy.ledger.path)
    return serve_app(build_app(policy, ledger=ledger, rewrite_fn=None)), ledger


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_backend_error_does_not_leak_url_credentials(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server, ledger = _proxy(f"http://user:{SECRET}@127.0.0.1:{_closed_port()}/v1", tmp_path)
    with server as url:
        r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30)
    assert r.status_code == 502
    assert SECRET not in r.text
    assert SECRET not in str(ledger.rows())
    assert SECRET.encode() not in (tmp_path / "l.sqlite").read_bytes()
    assert SECRET not in caplog.text


def test_url_credentials_are_sent_as_basic_auth_and_not_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    up = ScriptedUpstream(script=Script(body=completion()))
    with serve_app(up.app()) as up_url:
        host = up_url.removeprefix("http://")
        server, ledger = _proxy(f"http://user:{SECRET}@{host}/v1", tmp_path)
        with server as url:
            r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30)
    assert r.status_code == 200
    want = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert up.seen[-1].headers["authorization"] == want
    assert SECRET not in caplog.text
