"""Mid-conversation forms across the Anthropic -> OpenAI bridge and through the proxy
(issue 35, item 2): a system message inside ``messages`` is carried in place as a Chat system
message at the same position; a tool-change block, a ``defer_loading`` tool or an unknown block
is refused with a 400 naming the field (never dropped); beta headers reach the backend intact."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.bridges.anthropic_openai_request import request_to_openai
from prefixgate.proxy.core.errors import ProxyError
from tests.proxy.upstream import Script

TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
         {"role": "system", "content": [{"type": "text", "text": "From now on, French."}]},
         {"role": "user", "content": "next"}]


def _a(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 9, "system": "head", "messages": messages, **extra}


def test_a_mid_conversation_system_message_is_carried_at_its_position() -> None:
    out = request_to_openai(_a(TURNS))
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "system", "user"]
    assert out["messages"][3]["content"] == "From now on, French."
    assert out["messages"][0]["content"] == "head"  # never merged into the head


@pytest.mark.parametrize(("body", "param"), [
    (_a([{"role": "user", "content": [{"type": "tool_addition", "tool": {"name": "t"}}]}]),
     "messages[0].content[0].type"),
    (_a([{"role": "user", "content": [{"type": "future_block"}]}]), "messages[0].content[0].type"),
    (_a([{"role": "user", "content": "x"}],
        tools=[{"name": "t", "input_schema": {}, "defer_loading": True}]), "tools[0].defer_loading"),
    (_a([{"role": "user", "content": "x"}, {"role": "system", "content": [{"type": "image"}]}]),
     "messages[1].content[0].type"),
])
def test_forms_without_a_chat_counterpart_are_refused_naming_the_field(
        body: dict[str, Any], param: str) -> None:
    with pytest.raises(ProxyError) as e:
        request_to_openai(body)
    assert e.value.status == 400 and e.value.param == param


def test_through_the_proxy_the_system_message_keeps_its_place_and_betas_pass(
        rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(rewrite_fn="default",
                      backends={"oai": {"kind": "openai_compat", "base_url": upstream[1] + "/v1"},
                                "anth": {"kind": "anthropic", "base_url": upstream[1] + "/v1",
                                         "api_key": "${PG_TEST_ANTHROPIC_KEY}"}},
                      routes=[{"match": "claude-*", "backend": "anth"},
                              {"match": "*", "backend": "oai"}])
    rig.upstream.script = Script(body={"id": "chatcmpl-1", "object": "chat.completion",
                                       "created": 1, "model": "m", "choices": [
                                           {"index": 0, "finish_reason": "stop", "message": {
                                               "role": "assistant", "content": "ok"}}]})
    r = httpx.post(rig.url + "/v1/messages", json=_a(TURNS), timeout=10)
    assert r.status_code == 200, r.text
    sent = rig.upstream.seen[-1].json
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "system", "user"]
    betas = "mid-conversation-tool-changes-2026-07-01,cache-diagnosis-2026-04-07"
    rig.upstream.script = Script(body={"id": "msg_1", "type": "message", "role": "assistant",
                                       "model": "claude-x", "content": [
                                           {"type": "text", "text": "ok"}],
                                       "stop_reason": "end_turn", "usage": {
                                           "input_tokens": 5, "output_tokens": 1}})
    body = {**_a([*TURNS[:3], {"role": "user", "content": [
        {"type": "tool_addition", "tool": {"name": "t", "input_schema": {}}},
        {"type": "text", "text": "use t"}]}]), "model": "claude-x"}
    r = httpx.post(rig.url + "/v1/messages", json=body, timeout=10,
                   headers={"anthropic-beta": betas})
    assert r.status_code == 200, r.text
    seen = rig.upstream.seen[-1]
    assert seen.headers["anthropic-beta"] == betas
    assert seen.json["messages"] == body["messages"]  # every form where the client put it
