"""An OpenAI-compatible backend that reports a failure inside its stream (vLLM / SGLang send
``data: {"error": {...}}``) reaches an Anthropic client as Anthropic's own ``event: error``
with the message, instead of being dropped (the client saw a silent, empty answer)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.proxy.upstream import DONE, Script, chunk


def test_openai_stream_error_becomes_anthropic_error_event(rig: Any) -> None:
    err = b'data: {"error": {"message": "KV cache exhausted", "type": "server_error"}}\n\n'
    rig.upstream.script = Script(pieces=[chunk("a"), err, DONE])
    body = {"model": "m", "stream": True, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(rig.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e.strip()]
    errors = [e for e in events if e.startswith("event: error\n")]
    assert len(errors) == 1, r.text
    obj = json.loads(errors[0].split("data: ", 1)[1])
    assert obj == {"type": "error", "error": {"type": "api_error",
                                              "message": "KV cache exhausted"}}
