"""Malformed SSE events from the upstream (not JSON, JSON scalars, objects of the wrong shape)
neither kill the stream nor mislabel it: the client gets the whole stream with its proper end,
and the ledger row says ``ok``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.adversarial.conftest import body_for
from tests.proxy.upstream import wait_rows


@pytest.mark.parametrize("path,model,end", [
    ("/v1/chat/completions", "garbage-stream", b"data: [DONE]"),          # passthrough
    ("/v1/messages", "claude-garbage-stream", b"event: message_stop"),    # passthrough
    ("/v1/messages", "garbage-stream", b"event: message_stop"),           # A -> O bridge
    ("/v1/chat/completions", "claude-garbage-stream", b"data: [DONE]"),   # O -> A bridge
])
def test_malformed_upstream_events_do_not_break_the_stream(hostile: Any, path: str, model: str,
                                                           end: bytes) -> None:
    with httpx.stream("POST", hostile.url + path, json=body_for(path, model, stream=True),
                      timeout=30) as r:
        assert r.status_code == 200
        data = r.read()
    assert data.rstrip().endswith(end) or end + b"\n" in data, data[-300:]
    row = wait_rows(hostile.ledger, 1)[-1]
    assert row["status"] == "ok"
    assert row["ttft_ms"] is not None  # the good content events around the garbage were timed
