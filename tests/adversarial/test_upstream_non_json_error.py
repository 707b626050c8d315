"""An upstream error whose body is not JSON (a load balancer's HTML 502 page, an empty 503)
reaches the client with the upstream's status but as a JSON error in the client's API shape
(``application/json``), on the passthrough path and through a bridge alike. JSON error bodies
of the client's own API still pass through unchanged."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script

HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


@pytest.mark.parametrize("status,payload,media", [(502, HTML, "text/html"),
                                                  (500, HTML, "text/html"),
                                                  (503, b"", "text/plain")])
@pytest.mark.parametrize("path,model", [("/v1/chat/completions", "m"),
                                        ("/v1/chat/completions", "claude-x"),
                                        ("/v1/messages", "m"),
                                        ("/v1/messages", "claude-x")])
def test_non_json_upstream_error_is_shaped_json_with_upstream_status(
        rig: Any, status: int, payload: bytes, media: str, path: str, model: str) -> None:
    rig.upstream.script = Script(pieces=[payload], status=status, media_type=media)
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        body["max_tokens"] = 4
    r = httpx.post(rig.url + path, json=body, timeout=30)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
        assert isinstance(r.json()["error"]["message"], str)
    else:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert rig.ledger.rows()[-1]["status"] == "upstream_error"


def test_json_error_of_the_clients_api_passes_through_unchanged(rig: Any) -> None:
    err = {"error": {"message": "Rate limit", "type": "requests", "param": None,
                     "code": "rate_limit_exceeded"}, "extra": 1}
    rig.upstream.script = Script(body=err, status=429)
    r = httpx.post(rig.url + "/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    assert r.status_code == 429 and r.json() == err
