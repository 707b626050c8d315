"""A request the proxy has no endpoint for (wrong method, unknown path such as ``/v1/audio/speech``
or ``/v1/messages/batches``) gets 404 / 405 in the caller's API shape — Anthropic's for
``/v1/messages*`` paths, OpenAI's otherwise — never FastAPI's ``{"detail": ...}``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/chat/completions", 405),
    ("PUT", "/v1/chat/completions", 405),
    ("POST", "/v1/audio/speech", 404),
    ("PUT", "/v1/responses", 405),
    ("DELETE", "/v1/completions", 405),
    ("GET", "/nothing/here", 404),
    ("GET", "/v1/messages", 405),
    ("POST", "/v1/messages/batches", 404),
    ("GET", "/v1/messages/count_tokens", 405),
])
def test_unknown_endpoint_or_method_is_shaped(rig: Any, method: str, path: str,
                                              status: int) -> None:
    r = httpx.request(method, rig.url + path, json={"model": "m"}, timeout=30)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert "detail" not in body
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        assert body["error"]["type"] == ("not_found_error" if status == 404
                                         else "invalid_request_error")
        assert method in body["error"]["message"] and path in body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
        assert method in body["error"]["message"] and path in body["error"]["message"]
    if status == 405:
        assert "POST" in r.headers["allow"]
    assert rig.upstream.seen == []
