"""An upstream stream that breaks off or goes silent past the backend's timeout ends the
client's stream with an error event in the client's API shape (OpenAI ``data: {"error": ...}``,
Anthropic ``event: error``), closes the upstream, and records ``upstream_error``."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.adversarial.conftest import body_for
from tests.proxy.upstream import wait_rows


def _last_event(data: bytes) -> tuple[str | None, dict[str, Any]]:
    ev = data.strip().split(b"\n\n")[-1].decode()
    name = next((ln[6:].strip() for ln in ev.splitlines() if ln.startswith("event:")), None)
    payload = "".join(ln[5:].strip() for ln in ev.splitlines() if ln.startswith("data:"))
    return name, json.loads(payload)


@pytest.mark.parametrize("kind", ["cut-stream", "hang-stream"])
@pytest.mark.parametrize("path,prefix", [("/v1/chat/completions", ""),
                                         ("/v1/chat/completions", "claude-"),
                                         ("/v1/messages", ""),
                                         ("/v1/messages", "claude-")])
def test_broken_upstream_stream_ends_with_an_error_event(hostile: Any, kind: str, path: str,
                                                         prefix: str) -> None:
    t0 = time.monotonic()
    with httpx.stream("POST", hostile.url + path,
                      json=body_for(path, prefix + kind, stream=True), timeout=30) as r:
        assert r.status_code == 200
        data = r.read()
    assert time.monotonic() - t0 < 4.0  # the 1 s backend timeout, not the 5 s hang
    name, obj = _last_event(data)
    if path == "/v1/messages":
        assert name == "error"
        assert obj["type"] == "error" and obj["error"]["type"] == "api_error"
        assert obj["error"]["message"]
    else:
        assert name is None
        assert set(obj["error"]) == {"message", "type", "param", "code"}
        assert obj["error"]["code"] == ("upstream_timeout" if kind == "hang-stream"
                                        else "upstream_unavailable")
    row = wait_rows(hostile.ledger, 1)[-1]
    assert row["status"] == "upstream_error"
    assert row["ttft_ms"] is not None
    if kind == "hang-stream":  # the proxy hung up: the upstream's generator was cancelled
        deadline = time.monotonic() + 3.0
        while hostile.upstream.closed < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hostile.upstream.closed == 1
