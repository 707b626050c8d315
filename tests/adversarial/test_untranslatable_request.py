"""A request whose fields have types a bridge cannot translate (OpenAI client -> Anthropic
backend, or the other way) is a 400 in the caller's shape, not a 500 "internal error"; nothing
reaches the upstream and the ledger records ``InvalidRequest``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.adversarial.conftest import body_for

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path,model,extra", [
    # OpenAI client -> Anthropic backend
    ("/v1/chat/completions", "claude-x", {"stop": 5}),
    ("/v1/chat/completions", "claude-x", {"tools": [{"type": "function", "function": 5}]}),
    ("/v1/chat/completions", "claude-x", {"tool_choice": {"type": "function", "function": 5}}),
    ("/v1/chat/completions", "claude-x", {"messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": "abc"}]}),
    ("/v1/chat/completions", "claude-x", {"messages": USER + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]}]}),
    # Anthropic client -> OpenAI-compatible backend
    ("/v1/messages", "gpt-x", {"tools": 5}),
    ("/v1/messages", "gpt-x", {"metadata": 5}),
    ("/v1/messages", "gpt-x", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": 5}]}]}),
    ("/v1/messages", "gpt-x", {"messages": USER + [{"role": "assistant", "content": [
        {"type": "text", "text": 5}]}]}),
])
def test_untranslatable_field_types_are_400_in_callers_shape(hostile: Any, path: str, model: str,
                                                             extra: dict[str, Any]) -> None:
    r = httpx.post(hostile.url + path, json=body_for(path, model, **extra), timeout=30)
    assert r.status_code == 400, r.text
    if path == "/v1/messages":
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
    else:
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_value"
    assert "internal" not in r.text.lower()
    row = hostile.ledger.rows()[-1]
    assert (row["status"], row["http_status"]) == ("InvalidRequest", 400)
