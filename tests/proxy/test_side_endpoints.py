"""count_tokens, embeddings / completions pass-through, GET /v1/models/{id}, bare paths."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.upstream import DONE, Script, chunk

EMB = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1]}],
       "model": "m1", "usage": {"prompt_tokens": 3, "total_tokens": 3}}
MSG = {"model": "m1", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi there"}]}


def test_embeddings_pass_through_with_a_ledger_row(rig: Any) -> None:
    rig.upstream.script = Script(body=EMB)
    r = httpx.post(rig.url + "/v1/embeddings", json={"model": "m1", "input": "abc"}, timeout=10)
    assert r.json() == EMB
    assert rig.upstream.seen[-1].path == "/v1/embeddings"
    row = rig.ledger.rows()[-1]
    assert (row["endpoint"], row["backend"], row["prompt_tokens"], row["status"]) == (
        "/v1/embeddings", "up", 3, "ok")


def test_completions_stream_and_default_cap(rig_factory: Any) -> None:
    rig = rig_factory(default_max_tokens=40)
    rig.upstream.script = Script(pieces=[chunk("a"), chunk("b"), DONE])
    r = httpx.post(rig.url + "/v1/completions", timeout=10,
                   json={"model": "m1", "prompt": "x", "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.content.endswith(b"data: [DONE]\n\n")
    assert rig.upstream.seen[-1].json["max_tokens"] == 40
    assert rig.ledger.rows()[-1]["endpoint"] == "/v1/completions"


def test_embeddings_to_an_anthropic_route_is_a_501(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/embeddings", json={"model": "claude-x", "input": "a"},
                   timeout=10)
    assert r.status_code == 501 and r.json()["error"]["code"] == "unsupported_route"


def test_model_by_id(rig: Any) -> None:
    r = httpx.get(rig.url + "/v1/models/gpt-4o", timeout=10)
    assert r.json() == {"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "up"}
    r = httpx.get(rig.url + "/v1/models/nothing-routes-this", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_bare_paths_reach_the_v1_routes(rig: Any) -> None:
    rig.upstream.script = Script(body=EMB)
    r = httpx.post(rig.url + "/embeddings", json={"model": "m1", "input": "abc"}, timeout=10)
    assert r.status_code == 200 and rig.ledger.rows()[-1]["endpoint"] == "/v1/embeddings"
    assert httpx.get(rig.url + "/models", timeout=10).json()["object"] == "list"
    r = httpx.post(rig.url + "/messages", json={"model": "m1"}, timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape


def test_count_tokens_passes_through_to_anthropic(rig: Any) -> None:
    from anthropic import Anthropic

    rig.upstream.script = Script(body={"input_tokens": 42})
    client = Anthropic(base_url=rig.url, api_key="sk-proxy", max_retries=0)
    got = client.messages.count_tokens(model="claude-x", messages=[
        {"role": "user", "content": "Hi"}])
    assert got.input_tokens == 42
    assert rig.upstream.seen[-1].path == "/v1/messages/count_tokens"
    assert rig.upstream.seen[-1].headers["x-api-key"] == "sk-ant-backend-KEY"


def test_count_tokens_estimates_when_the_backend_has_no_tokenize(rig: Any) -> None:
    # the scripted OpenAI-compatible upstream serves no /tokenize: an estimate, marked as one
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json=MSG, timeout=10)
    assert r.headers["x-prefixgate-token-count"] == "estimated"
    assert r.json()["estimated"] is True and 6 <= r.json()["input_tokens"] <= 30
    assert not any(row["endpoint"].endswith("count_tokens") for row in rig.ledger.rows())
