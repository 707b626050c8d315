"""``POST /tokenize`` / ``/detokenize``: the ids generation would prefill, no KV work."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.engine_server.conftest import MAX_CONTEXT

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"}]


def _tok(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(base_url + "/tokenize", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _chat_usage(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(base_url + "/v1/chat/completions", timeout=60,
                      json={**body, "max_tokens": 1, "temperature": 0})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["usage"])


def test_chat_tokenize_count_equals_the_prompt_tokens_generation_prefills(
        base_url: str, engine: Any) -> None:
    body = {"messages": MESSAGES, "tools": TOOLS}
    got = _tok(base_url, body)
    assert got["count"] == len(got["tokens"]) == _chat_usage(base_url, body)["prompt_tokens"]
    assert got["max_model_len"] == MAX_CONTEXT
    text = engine.tokenizer.decode(got["tokens"])
    # the engine's rendering: system text first, the tools block after it, then the user turn
    assert text.index("You are terse.") < text.index("get_weather") < text.index("Paris")


def test_tokenize_does_not_touch_the_prefix_cache(base_url: str, engine: Any) -> None:
    body = {"messages": [{"role": "user", "content": "A never seen prompt about owls 7731."}],
            "cache_salt": "tokenize-only"}  # a salt no request used: nothing shared with others
    before = engine.stats()
    _tok(base_url, body)
    assert engine.stats()["kv_slots_cached"] == before["kv_slots_cached"]
    assert _chat_usage(base_url, body)["prompt_tokens_details"]["cached_tokens"] == 0


def test_repeated_chat_hits_the_cache_up_to_the_tokenized_common_prefix(base_url: str) -> None:
    first = {"messages": [{"role": "user", "content": "Tell me about radix trees 4411."}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "They share."},
                           {"role": "user", "content": "And eviction?"}]}
    a, b = _tok(base_url, first)["tokens"], _tok(base_url, second)["tokens"]
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert 0 < common < len(b)
    _chat_usage(base_url, first)
    cached = _chat_usage(base_url, second)["prompt_tokens_details"]["cached_tokens"]
    assert cached >= common  # the engine also keeps the first answer's tokens


def test_add_generation_prompt_false_drops_the_assistant_header(base_url: str) -> None:
    with_prompt = _tok(base_url, {"messages": MESSAGES})["tokens"]
    without = _tok(base_url, {"messages": MESSAGES, "add_generation_prompt": False})["tokens"]
    assert len(without) < len(with_prompt) and with_prompt[:len(without)] == without


def test_prompt_tokenize_matches_completions_and_detokenize_round_trips(base_url: str) -> None:
    got = _tok(base_url, {"prompt": "hello radix world", "return_token_strs": True})
    assert len(got["token_strs"]) == got["count"]
    resp = httpx.post(base_url + "/v1/completions", timeout=60,
                      json={"prompt": "hello radix world", "max_tokens": 1})
    assert resp.json()["usage"]["prompt_tokens"] == got["count"]
    back = httpx.post(base_url + "/detokenize", json={"tokens": got["tokens"]}, timeout=30)
    assert back.status_code == 200 and back.json() == {"prompt": "hello radix world"}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "messages"),
    ("/tokenize", {}, "messages"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ("/tokenize", {"prompt": [10 ** 9]}, "prompt"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_bodies_are_openai_400s(base_url: str, path: str, body: dict[str, Any],
                                    param: str) -> None:
    resp = httpx.post(base_url + path, json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param
