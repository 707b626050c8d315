"""A stream (bridged or passthrough) whose upstream closes cleanly but without its final event (OpenAI
``[DONE]``, Anthropic ``message_stop``) cannot be completed faithfully in the client's API: it
ends with an error event in the client's shape and is recorded as ``upstream_error``, instead
of stopping mid-message (an Anthropic client never got ``message_stop``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script, chunk

A_START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"x",'
           b'"usage":{"input_tokens":3}}}\n\n')
A_TEXT = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
          b'"delta":{"type":"text_delta","text":"a"}}\n\n')


@pytest.mark.parametrize("path,model,pieces", [
    ("/v1/messages", "m", [chunk("a"), chunk(finish="stop")]),           # A client, O backend
    ("/v1/chat/completions", "claude-x", [A_START, A_TEXT]),            # O client, A backend
])
def test_bridged_stream_without_final_event_ends_with_error(rig: Any, path: str, model: str,
                                                            pieces: list[bytes]) -> None:
    rig.upstream.script = Script(pieces=pieces)
    body = {"model": model, "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(rig.url + path, json=body, timeout=30)
    assert r.status_code == 200
    last = [e for e in r.text.split("\n\n") if e.strip()][-1]
    obj = json.loads(last.split("data: ", 1)[1])
    if path == "/v1/messages":
        assert last.startswith("event: error\n") and obj["type"] == "error"
    else:
        assert obj["error"]["code"] == "upstream_unavailable"
    assert rig.ledger.rows()[-1]["status"] == "upstream_error"


def test_passthrough_stream_without_done_is_relayed_then_ends_with_error(rig: Any) -> None:
    """Passthrough too (issue 8, class 7): the events arrive as sent, then one error event; the
    row says ``upstream_error``, not ok."""
    rig.upstream.script = Script(pieces=[chunk("a"), chunk(finish="stop")])
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, json={
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    sent = chunk("a") + chunk(finish="stop")
    assert r.content.startswith(sent)
    assert json.loads(r.content[len(sent):].split(b"data: ", 1)[1])["error"]["code"] == (
        "upstream_unavailable")
    assert rig.ledger.rows()[-1]["status"] == "upstream_error"
