"""A 200 answer that is not a JSON object (garbage bytes, a JSON array, HTML) is a 502 in the
caller's shape on the passthrough path too (client and backend speak the same API), as it
already is through a bridge: the client's SDK gets a clear error, not an undecodable 200."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ABODY = {"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("payload,media", [
    (b"\x00\xffnot json", "application/json"),
    (b"[1, 2]", "application/json"),
    (b"<html><body>upstream proxy page</body></html>", "text/html"),
])
@pytest.mark.parametrize("path,body", [("/v1/chat/completions", BODY), ("/v1/messages", ABODY)])
def test_unreadable_200_answer_is_502_in_callers_shape(rig: Any, payload: bytes, media: str,
                                                       path: str, body: Any) -> None:
    rig.upstream.script = Script(pieces=[payload], media_type=media)
    r = httpx.post(rig.url + path, json=body, timeout=30)
    assert r.status_code == 502, r.text
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    else:
        assert r.json()["error"]["code"] == "upstream_unavailable"
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["http_status"]) == ("upstream_error", 502)  # what the client got
