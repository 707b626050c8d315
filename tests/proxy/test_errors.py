"""Bad input gets an error in the caller's API shape with the right status; each is recorded."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.proxy.upstream import Script, completion

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(url: str, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
    return httpx.post(url + path, timeout=30, **kw)


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None,
                        param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code:
        assert err["code"] == code
    if param:
        assert err["param"] == param
    return err


@pytest.mark.parametrize("content,code", [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_json"),
    (b"", "invalid_json"),
])
def test_unparseable_body_is_400_invalid_json(rig: Any, content: bytes, code: str) -> None:
    r = post(rig.url, content=content, headers={"content-type": "application/json"})
    assert_openai_error(r, 400, code)
    assert rig.upstream.seen == []


@pytest.mark.parametrize("body,param,code", [
    ({"model": "m"}, "messages", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model", "missing_required_parameter"),
    ({"model": "m", "messages": "hello"}, "messages", "invalid_type"),
    ({"model": 7, "messages": [{"role": "user", "content": "x"}]}, "model", "invalid_type"),
    ({"model": "m", "messages": []}, "messages", "invalid_value"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", "invalid_type"),
    ({"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}, "stream",
     "invalid_type"),
])
def test_missing_or_mistyped_fields_are_400_naming_the_param(rig: Any, body: Any, param: str,
                                                             code: str) -> None:
    assert_openai_error(post(rig.url, json=body), 400, code, param)


def test_unknown_model_is_404_model_not_found(rig: Any) -> None:
    r = post(rig.url, json={**OK, "model": "nobody-serves-this"})
    assert_openai_error(r, 404, "model_not_found", "model")
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["http_status"], row["model"]) == ("ModelNotFound", 404,
                                                                 "nobody-serves-this")


def test_b19_body_over_limit_is_413_in_both_api_shapes(rig_factory: Any) -> None:
    rig = rig_factory(max_body_bytes=1_000_000)
    image = base64.b64encode(b"\x89PNG" + b"\0" * 1_500_000).decode()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}}]}]}
    assert_openai_error(post(rig.url, json=body), 413, "request_too_large")
    r = post(rig.url, "/v1/messages", json={"model": "claude-x", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": image}}]}]})
    assert r.status_code == 413
    assert r.json() == {"type": "error", "error": {"type": "request_too_large",
                                                   "message": r.json()["error"]["message"]}}
    assert rig.upstream.seen == []


def test_body_under_limit_with_a_3mb_image_passes_through_unchanged(rig: Any) -> None:
    image = base64.b64encode(b"\x89PNG" + b"\1" * 2_300_000).decode()
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}}]}]}
    raw = httpx.Request("POST", "http://x", json=body).content
    rig.upstream.script = Script(body=completion())
    r = post(rig.url, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert rig.upstream.seen[-1].raw == raw  # original bytes, not re-serialized
    # megabytes of base64 are not token-counted for the break / counterfactual analysis: the
    # body went upstream as-is, so its counterfactual is the upstream's own count
    row = rig.ledger.rows()[-1]
    assert row["cf_cached_tokens"] == row["cached_tokens"] is not None


def test_upstream_down_is_502(rig_factory: Any, tmp_path: Any) -> None:
    from prefixgate.cache.ledger.store import Ledger
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.app import build_app
    from tests.servers import serve_app

    policy = parse_policy({"backends": {"dead": {"kind": "openai_compat",
                                                 "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "dead"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite")}})
    ledger = Ledger(policy.ledger.path)
    with serve_app(build_app(policy, ledger=ledger, rewrite_fn=None)) as url:
        err = assert_openai_error(post(url, json=OK), 502, "upstream_unavailable")
        assert "127.0.0.1:9" in err["message"]
        r = post(url, "/v1/messages", json={"model": "x", "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and r.json()["type"] == "error"
    assert [r["status"] for r in ledger.rows()] == ["UpstreamUnavailable"] * 2


def test_upstream_4xx_is_passed_through_with_its_body(rig: Any) -> None:
    upstream_err = {"error": {"message": "This model's maximum context length is 8192 tokens",
                              "type": "invalid_request_error", "param": "messages",
                              "code": "context_length_exceeded"}}
    rig.upstream.script = Script(body=upstream_err, status=400)
    r = post(rig.url, json={**OK, "stream": True})
    assert r.status_code == 400 and r.json() == upstream_err
    row = rig.ledger.rows()[-1]
    assert (row["status"], row["http_status"]) == ("upstream_error", 400)


def test_anthropic_endpoint_checks_max_tokens(rig: Any) -> None:
    r = post(rig.url, "/v1/messages", json={"model": "claude-x", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_route_to_the_other_api_without_a_bridge_is_a_clear_501() -> None:
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.core.errors import NotSupported
    from prefixgate.proxy.routing.router import pick_target

    policy = parse_policy({"backends": {"a": {"kind": "anthropic",
                                              "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "a"}]})
    with pytest.raises(NotSupported) as e:
        pick_target(policy, "claude-x", "openai", can_translate=False)
    assert e.value.status == 501 and e.value.code == "unsupported_route"
    assert pick_target(policy, "claude-x", "openai", can_translate=True).translate


def test_a_proxy_bug_is_a_shaped_500_and_still_recorded(rig: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixgate.proxy.bridges.anthropic_openai import AnthropicToOpenAI

    def boom(self: Any, body: Any, *limits: Any) -> Any:
        raise KeyError("unexpected")

    monkeypatch.setattr(AnthropicToOpenAI, "request", boom)
    r = post(rig.url, "/v1/messages", json={"model": "m", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 500
    assert r.json()["type"] == "error" and "KeyError" in r.json()["error"]["message"]
    assert rig.ledger.rows()[-1]["status"] == "InternalError"


def test_upstream_sending_unreadable_json_is_502(rig: Any) -> None:
    rig.upstream.script = Script(pieces=[b"{not json"], media_type="application/json")
    r = post(rig.url, "/v1/messages", json={"model": "m", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502 and r.json()["type"] == "error"
    assert rig.ledger.rows()[-1]["status"] == "upstream_error"
