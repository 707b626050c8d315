"""Header forwarding (cases B20, B21): allowlist only, the backend's own key, never the client's."""

from __future__ import annotations

from typing import Any

import httpx

from prefixgate.proxy.http.headers import redacted
from tests.proxy.upstream import Script, completion


def test_b21_client_credential_cookies_and_forwarding_headers_never_reach_upstream(
        rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]},
                   headers={"Authorization": "Bearer sk-proxy-CLIENTKEY", "Cookie": "sid=abc",
                            "X-Forwarded-For": "10.0.0.5", "X-Request-Id": "r1",
                            "Proxy-Authorization": "Basic eA==", "x-pass-secret": "s",
                            "OpenAI-Organization": "org-1"})
    assert r.status_code == 200
    seen = rig.upstream.seen[-1]
    assert not any("sk-proxy-" in v for v in seen.headers.values())
    assert "authorization" not in seen.headers  # the openai_compat backend has no key
    for h in ("cookie", "x-forwarded-for", "proxy-authorization", "x-pass-secret"):
        assert h not in seen.headers
    assert seen.headers["x-request-id"] == "r1"
    assert seen.headers["openai-organization"] == "org-1"


def test_b21_anthropic_variant_uses_the_backends_configured_key(rig: Any) -> None:
    rig.upstream.script = Script(body={"id": "msg_1", "type": "message", "role": "assistant",
                                       "content": [], "usage": {"input_tokens": 1,
                                                                "output_tokens": 1}})
    r = httpx.post(rig.url + "/v1/messages", timeout=30,
                   json={"model": "claude-x", "max_tokens": 16,
                         "messages": [{"role": "user", "content": "hi"}]},
                   headers={"x-api-key": "sk-proxy-CLIENTKEY", "Cookie": "sid=abc"})
    assert r.status_code == 200
    seen = rig.upstream.seen[-1]
    assert not any("sk-proxy-" in v for v in seen.headers.values())
    assert seen.headers["x-api-key"] == "sk-ant-backend-KEY"
    assert seen.headers["anthropic-version"] == "2023-06-01"  # default added when absent


def test_b20_anthropic_beta_comma_list_reaches_upstream_intact(rig: Any) -> None:
    rig.upstream.script = Script(body={"id": "msg_1", "type": "message", "role": "assistant",
                                       "content": [], "usage": {"input_tokens": 1,
                                                                "output_tokens": 1}})
    beta = "context-1m-2025-08-07,prompt-caching-2024-07-31"
    httpx.post(rig.url + "/v1/messages", timeout=30,
               json={"model": "claude-x", "max_tokens": 16,
                     "messages": [{"role": "user", "content": "hi"}]},
               headers={"x-api-key": "sk-proxy-K", "anthropic-version": "2023-06-01",
                        "anthropic-beta": beta})
    seen = rig.upstream.seen[-1]
    assert seen.headers["anthropic-beta"] == beta
    assert seen.headers["anthropic-version"] == "2023-06-01"


def test_logs_redact_credentials() -> None:
    out = redacted([("Authorization", "Bearer sk-proxy-X"), ("x-api-key", "k"), ("a", "b")])
    assert out == {"Authorization": "<redacted>", "x-api-key": "<redacted>", "a": "b"}
