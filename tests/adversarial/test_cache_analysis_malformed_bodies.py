"""The after-answer cache analysis (break detector + counterfactual cache model, fed through
:mod:`prefixgate.cache.provider_models.prefix_blocks`) takes bodies whose fields have the wrong JSON types — a lenient
backend may have answered them — without raising: no traceback is logged per request, and the
fields of the wrong type simply add no block."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from prefixgate.cache.provider_models.prefix_blocks import detect_api, flatten
from prefixgate.proxy.observe.insight import Insight

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize("api,body", [
    ("openai", {"model": "gpt-4o", "messages": [USER], "tools": True}),
    ("openai", {"model": "gpt-4o", "messages": [USER], "tools": 5,
                "response_format": {"type": "json_schema"}}),
    ("openai", {"model": "gpt-4o", "messages": [USER, {"role": "assistant", "tool_calls": 5}]}),
    ("openai", {"model": "gpt-4o", "messages": [USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "function": 5}]}]}),
    ("anthropic", {"model": "claude-3-5-sonnet", "max_tokens": 5, "messages": [USER],
                   "tools": 5}),
    ("anthropic", {"model": "claude-3-5-sonnet", "max_tokens": 5, "messages": [USER],
                   "system": 1.5}),
    ("anthropic", {"model": "claude-3-5-sonnet", "max_tokens": 5,
                   "messages": [{"role": "user", "content": 5}]}),
    ("anthropic", {"model": "claude-3-5-sonnet", "max_tokens": 5,
                   "messages": [{"role": "user", "content": True}]}),
])
def test_malformed_fields_add_no_block_and_raise_nothing(
        api: Any, body: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    blocks = flatten(body, api, len)
    assert [b.kind for b in blocks].count("tool") == 0  # no tool is well-formed here
    assert detect_api(body) in ("openai", "anthropic")
    caplog.set_level(logging.WARNING)
    insight = Insight(False)
    provider = "anthropic" if api == "anthropic" else "openai"
    for _ in range(2):  # the second call compares against the first (break detection)
        insight.observe(session="s", backend="b", provider=provider, api=api,
                        model=body["model"], original=body, sent=body)
    assert not [r for r in caplog.records if r.exc_info], caplog.text
