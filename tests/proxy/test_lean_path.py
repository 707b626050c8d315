"""The lean path (issue 25; :mod:`prefixgate.proxy.http.lean`) answers exactly as the full
FastAPI stack does: the same requests sent to the proxy with and without it get the same status,
body and headers — answers, every error shape (400 / 401 / 404 / 405 / 413), bare and
trailing-slash paths — and the chat POSTs really take it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from prefixgate.cache.ledger.store import Ledger
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import hash_key
from prefixgate.proxy.http.lean import LEAN_PATHS, LeanRoutes
from tests.proxy.conftest import make_policy
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

KEY = "sk-proxy-test-key"
VOLATILE = {"date", "server", "x-request-id"}


def _app(up_url: str, tmp: Path, lean: bool) -> FastAPI:
    policy = make_policy(up_url, tmp / f"ledger-{lean}.sqlite",
                         auth={"keys": [{"id": "k_one", "hash": hash_key(KEY)}]},
                         max_body_bytes=64_000)
    app = build_app(policy, ledger=Ledger(policy.ledger.path), rewrite_fn=None)
    if not lean:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not LeanRoutes]
    return app


def _lean_of(app: FastAPI) -> LeanRoutes | None:
    node: Any = app.middleware_stack
    while node is not None:
        if isinstance(node, LeanRoutes):
            return node
        node = getattr(node, "app", None)
    return None


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[tuple[str, str, ScriptedUpstream, FastAPI]]:
    monkeypatch.setenv("PG_TEST_ANTHROPIC_KEY", "sk-ant-backend-KEY")
    up = ScriptedUpstream(script=Script(body=completion("hello")))
    with serve_app(up.app()) as up_url:
        lean_app = _app(up_url, tmp_path, True)
        with serve_app(lean_app) as lean, serve_app(_app(up_url, tmp_path, False)) as full:
            yield lean, full, up, lean_app


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
CASES: list[tuple[str, str, dict[str, str], bytes]] = [
    ("POST", "/v1/chat/completions", {}, json.dumps(CHAT).encode()),
    ("POST", "/chat/completions", {}, json.dumps(CHAT).encode()),
    ("POST", "/v1/chat/completions/", {}, json.dumps(CHAT).encode()),
    ("POST", "/v1/chat/completions", {}, b'{"model": "m1", "messages": '),
    ("POST", "/v1/chat/completions", {}, b'{"model": "m1"}'),
    ("POST", "/v1/chat/completions", {}, json.dumps({**CHAT, "model": "nope"}).encode()),
    ("POST", "/v1/chat/completions", {"authorization": "Bearer wrong"},
     json.dumps(CHAT).encode()),
    ("POST", "/v1/chat/completions", {}, b'{"model": "m1", "messages": [' + b" " * 70_000),
    ("GET", "/v1/chat/completions", {}, b""),
    ("POST", "/v1/messages", {}, b'{"model": "claude-x"}'),
    ("POST", "/messages/", {}, json.dumps({"model": "nope", "max_tokens": 5,
                                          "messages": [{"role": "user", "content": "x"}]
                                          }).encode()),
    ("PUT", "/v1/messages", {}, b"{}"),
]


def _answer(base: str, method: str, path: str, headers: dict[str, str], body: bytes
            ) -> tuple[int, bytes, dict[str, str]]:
    hdrs = {"authorization": f"Bearer {KEY}", "content-type": "application/json", **headers}
    r = httpx.request(method, base + path, headers=hdrs, content=body or None, timeout=30)
    kept = {k: v for k, v in r.headers.items() if k not in VOLATILE}
    return r.status_code, r.content, kept


def test_lean_and_full_stack_answer_alike(pair: tuple[str, str, ScriptedUpstream, FastAPI],
                                          caplog: pytest.LogCaptureFixture) -> None:
    lean, full, up, lean_app = pair
    statuses = set()
    caplog.set_level(logging.ERROR)
    for method, path, headers, body in CASES:
        a = _answer(lean, method, path, headers, body)
        b = _answer(full, method, path, headers, body)
        assert a == b, (method, path)
        statuses.add(a[0])
    assert {200, 400, 401, 404, 405, 413} <= statuses
    # every error was answered by its handler, none escaped to the server-error layer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    node = _lean_of(lean_app)
    assert node is not None and set(node.table()) == set(LEAN_PATHS)  # the chat POSTs took it


def test_the_full_stack_app_has_no_lean_layer(pair: tuple[str, str, ScriptedUpstream, FastAPI]
                                              ) -> None:
    """The comparison above is against an app without the lean layer (not two lean apps)."""
    lean, _, _, lean_app = pair
    assert _lean_of(lean_app) is not None
    other = _app("http://127.0.0.1:9", Path("/tmp"), False)
    other.middleware_stack = other.build_middleware_stack()
    assert _lean_of(other) is None


def test_the_chat_routes_stay_in_the_openapi_document() -> None:
    app = _app("http://127.0.0.1:9", Path("/tmp"), True)
    paths = app.openapi()["paths"]
    assert "post" in paths["/v1/chat/completions"] and "post" in paths["/v1/messages"]
