"""A streamed request (``stream: true``) that the upstream answers with a plain JSON body
instead of an SSE stream gets a 502 in the caller's shape, not that JSON relayed under
``text/event-stream`` (which SDKs read as an empty stream)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script, completion


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_stream_request_answered_with_json_is_502(rig: Any, path: str) -> None:
    rig.upstream.script = Script(body=completion())
    body = {"model": "m", "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(rig.url + path, json=body, timeout=30)
    assert r.status_code == 502, r.text
    assert r.headers["content-type"].startswith("application/json")
    if path == "/v1/messages":
        assert r.json()["type"] == "error"
    else:
        assert r.json()["error"]["code"] == "upstream_unavailable"
    assert "stream" in r.text
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["stream"]) == ("upstream_error", 1)
