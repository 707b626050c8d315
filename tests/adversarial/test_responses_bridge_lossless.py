"""The Responses -> Chat bridge is lossless or refuses (issue 20, class 10): ``prompt``,
``conversation``, ``max_tool_calls``, ``truncation``, ``reasoning``, ``include``,
``text.verbosity`` and ``top_logprobs`` answered 200 and never reached the backend. Every field is
now carried, served by the proxy, or refused with a 400 naming it — including fields no list
names."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.bridges.responses_chat_items import REQUEST_FIELDS, to_chat
from prefixgate.proxy.core.errors import InvalidRequest

BASE = {"model": "m", "input": "hi"}


@pytest.mark.parametrize("field, value, param", [
    ("prompt", {"id": "pmpt_1"}, "prompt"),
    ("conversation", "conv_1", "conversation"),
    ("max_tool_calls", 3, "max_tool_calls"),
    ("truncation", "auto", "truncation"),
    ("include", ["reasoning.encrypted_content"], "include"),
    ("top_logprobs", 5, "top_logprobs"),
    ("reasoning", {"effort": "low", "summary": "auto"}, "reasoning.summary"),
    ("text", {"verbosity": "low", "shape": "x"}, "text.shape"),
    ("stream_options", {"include_usage": True}, "stream_options.include_usage"),
    ("frobnicate", True, "frobnicate"),  # a field nobody lists
    ("modalities", ["text"], "modalities"),
    ("background", True, "background"),
])
def test_a_field_the_bridge_cannot_carry_is_a_400_naming_it(field: str, value: Any,
                                                            param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        to_chat({**BASE, field: value}, [])
    assert e.value.param == param and e.value.status == 400


@pytest.mark.parametrize("field, value", [
    ("include", []), ("top_logprobs", 0), ("truncation", "disabled"), ("max_tool_calls", None),
    ("prompt", None), ("background", False), ("stream_options", {"include_obfuscation": False}),
    ("metadata", {"a": "b"}), ("store", False),
])
def test_a_default_value_means_the_same_as_leaving_it_out(field: str, value: Any) -> None:
    assert to_chat({**BASE, field: value}, []) == to_chat(BASE, [])


@pytest.mark.parametrize("field, value, chat_field, chat_value", [
    ("prompt_cache_key", "k1", "prompt_cache_key", "k1"),
    ("prompt_cache_retention", "24h", "prompt_cache_retention", "24h"),
    ("safety_identifier", "u-1", "safety_identifier", "u-1"),
    ("service_tier", "flex", "service_tier", "flex"),
    ("reasoning", {"effort": "high"}, "reasoning_effort", "high"),
    ("text", {"verbosity": "low"}, "verbosity", "low"),
    ("max_output_tokens", 7, "max_tokens", 7),
    ("user", "me", "user", "me"),
])
def test_a_carried_field_reaches_the_chat_body(field: str, value: Any, chat_field: str,
                                               chat_value: Any) -> None:
    assert to_chat({**BASE, field: value}, [])[chat_field] == chat_value


def test_every_mapped_field_changes_the_chat_body() -> None:
    """Each ``map`` field of the table, set to a non-default value, reaches the Chat body (a
    table row that claims a mapping the code does not do fails here)."""
    samples: dict[str, Any] = {
        "instructions": "be brief", "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": "required", "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.5,
        "parallel_tool_calls": False, "user": "u", "text": {"format": {"type": "json_object"}},
        "reasoning": {"effort": "low"}, "prompt_cache_key": "k", "prompt_cache_retention": "24h",
        "safety_identifier": "s", "service_tier": "flex",
    }
    plain = to_chat(BASE, [])
    for field, how in REQUEST_FIELDS.items():
        if how != "map" or field in ("model", "input"):
            continue
        body = {**BASE, field: samples[field]}
        if field == "tool_choice":
            body["tools"] = samples["tools"]
        out = to_chat(body, [])
        assert out != (to_chat({**BASE, "tools": samples["tools"]}, []) if field == "tool_choice"
                       else plain), field


def test_through_the_proxy_the_refusal_is_openai_shaped_and_nothing_is_sent(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/responses", json={**BASE, "max_tool_calls": 2}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tool_calls"
    assert rig.upstream.seen == []
