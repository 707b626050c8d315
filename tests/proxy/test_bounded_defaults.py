"""A request that names no output cap gets its route's default from the policy (issue 11, 4)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.proxy.upstream import Script, completion

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def _sent(rig: Any, body: dict[str, Any]) -> Any:
    rig.upstream.script = Script(body=completion("ok"))
    r = httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return rig.upstream.seen[-1]


def test_a_body_without_a_cap_gets_the_policy_default(rig_factory: Any) -> None:
    rig = rig_factory(default_max_tokens=1024)
    assert _sent(rig, BODY).json["max_tokens"] == 1024


def test_the_routes_own_default_wins_over_the_policys(rig_factory: Any) -> None:
    rig = rig_factory(default_max_tokens=1024, routes=[
        {"match": "m*", "backend": "up", "default_max_tokens": 64}])
    assert _sent(rig, BODY).json["max_tokens"] == 64


def test_a_cap_the_client_sent_is_kept_and_its_bytes_go_out_unchanged(rig_factory: Any) -> None:
    rig = rig_factory(default_max_tokens=1024)
    for field in ("max_tokens", "max_completion_tokens"):
        raw = httpx.Request("POST", "/", json={**BODY, field: 7}).content
        rig.upstream.script = Script(body=completion("ok"))
        httpx.post(rig.url + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"content-type": "application/json"})
        assert rig.upstream.seen[-1].raw == raw


def test_an_openai_backend_gets_max_completion_tokens(rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(default_max_tokens=300, backends={
        "oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
        routes=[{"match": "m*", "backend": "oai"}])
    sent = _sent(rig, BODY).json
    assert sent["max_completion_tokens"] == 300 and "max_tokens" not in sent


def test_zero_turns_the_default_off(rig_factory: Any) -> None:
    rig = rig_factory(default_max_tokens=1024, routes=[
        {"match": "m*", "backend": "up", "default_max_tokens": 0}])
    assert "max_tokens" not in _sent(rig, BODY).json
