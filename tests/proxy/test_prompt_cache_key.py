"""``prompt_cache_key`` by default on OpenAI routes, one key per conversation (issue 35, item 1).

OpenAI routes a request by a hash of the first ~256 prompt tokens combined with
``prompt_cache_key``, and more than ~15 requests a minute for one prefix+key overflow to cold
machines (https://developers.openai.com/api/docs/guides/prompt-caching). Through the proxy, with
the shipped settings: each conversation gets its own key, its turns the same one; a client's own
key and retention pass through; a fallback of a kind that does not know the field never sees it.
"""

from __future__ import annotations

from typing import Any

import httpx

from prefixgate.config.backend_kinds import BACKEND_KINDS
from tests.proxy.upstream import Script, completion

SYSTEM = "You are an airline agent. Follow the policy below exactly. " * 40  # > 1,024 tokens


def _chat(first_user: str, *later: str) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": first_user}]
    for text in later:
        msgs += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": text}]
    return {"model": "gpt-4o", "messages": msgs}


def _openai_rig(rig_factory: Any, upstream: Any, **extra: Any) -> Any:
    rig = rig_factory(rewrite_fn="default",
                      backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"},
                                "vllm": {"kind": "openai_compat", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "gpt-*", "backend": "oai", "fallbacks": ["vllm"]}], **extra)
    rig.upstream.script = Script(body=completion())
    return rig


def _send(rig: Any, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return rig.upstream.seen[-1].json  # type: ignore[no-any-return]


def test_each_conversation_gets_its_own_key_and_keeps_it_across_turns(
        rig_factory: Any, upstream: Any) -> None:
    rig = _openai_rig(rig_factory, upstream)
    a1 = _send(rig, _chat("I need to change my flight"))
    b1 = _send(rig, _chat("Cancel my reservation please"))
    a2 = _send(rig, _chat("I need to change my flight", "booking ABC123"))
    assert a1["prompt_cache_key"] == a2["prompt_cache_key"]
    assert a1["prompt_cache_key"] != b1["prompt_cache_key"]
    assert a1["prompt_cache_key"].startswith("default-")
    # nothing the model reads changed: the messages went out as sent
    assert a2["messages"] == _chat("I need to change my flight", "booking ABC123")["messages"]


def test_a_clients_own_key_and_retention_pass_through(rig_factory: Any, upstream: Any) -> None:
    rig = _openai_rig(rig_factory, upstream)
    sent = _send(rig, {**_chat("hello"), "prompt_cache_key": "mine",
                       "prompt_cache_retention": "24h"})
    assert (sent["prompt_cache_key"], sent["prompt_cache_retention"]) == ("mine", "24h")


def test_a_fallback_of_another_kind_never_sees_the_key_prefixgate_added(
        rig_factory: Any, upstream: Any) -> None:
    assert BACKEND_KINDS["openai"].prompt_cache_key
    assert not BACKEND_KINDS["openai_compat"].prompt_cache_key
    rig = _openai_rig(rig_factory, upstream)
    answers = [Script(status=503, body={"error": {"message": "busy"}}), Script(body=completion())]
    rig.upstream.script = lambda body: answers.pop(0)
    r = httpx.post(rig.url + "/v1/chat/completions", json=_chat("hello"), timeout=10)
    assert r.status_code == 200, r.text
    first, fallback = (s.json for s in rig.upstream.seen[-2:])
    assert "prompt_cache_key" in first
    assert "prompt_cache_key" not in fallback and fallback["messages"] == first["messages"]


def test_the_key_can_be_switched_off_per_policy(rig_factory: Any, upstream: Any) -> None:
    rig = _openai_rig(rig_factory, upstream, rewrite={"openai_prompt_cache_key": False})
    assert "prompt_cache_key" not in _send(rig, _chat("hello"))


def test_a_responses_request_is_keyed_by_its_input_length_too(rig_factory: Any, upstream: Any) -> None:
    """Short instructions, long input: the prompt can be cached, so it gets its key; a short
    one does not (nothing to route)."""
    rig = _openai_rig(rig_factory, upstream)
    rig.upstream.script = Script(body={"id": "resp_1", "object": "response", "output": []})
    long_input = [{"role": "user", "content": [{"type": "input_text",
                                                "text": "Here is my booking history. " * 60}]}]
    for inp, keyed in ((long_input, True), ("hi", False)):
        r = httpx.post(rig.url + "/v1/responses", timeout=10,
                       json={"model": "gpt-4o", "instructions": "Be brief.", "input": inp})
        assert r.status_code == 200, r.text
        sent = rig.upstream.seen[-1].json
        assert ("prompt_cache_key" in sent) is keyed
        assert sent["input"] == inp


def test_an_anthropic_client_bridged_to_openai_gets_its_conversation_key(
        rig_factory: Any, upstream: Any) -> None:
    """The bridged path keys by conversation as the native one does (neurolink #1766: 28 %
    cached bridged without a key against 49 % native)."""
    rig = rig_factory(rewrite_fn="default",
                      backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "*", "backend": "oai"}])
    rig.upstream.script = Script(body=completion())
    body = {"model": "gpt-4o", "max_tokens": 9, "system": SYSTEM,
            "messages": [{"role": "user", "content": "I need to change my flight"}]}
    keys = []
    for first in ("I need to change my flight", "Cancel my reservation"):
        r = httpx.post(rig.url + "/v1/messages", timeout=10, json={
            **body, "messages": [{"role": "user", "content": first}]})
        assert r.status_code == 200, r.text
        sent = rig.upstream.seen[-1].json
        assert sent["messages"][0] == {"role": "system", "content": SYSTEM}
        keys.append(sent["prompt_cache_key"])
    assert keys[0] != keys[1] and all(k.startswith("default-") for k in keys)
