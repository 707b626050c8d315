"""Header values are bytes: a non-ASCII byte in any header the proxy forwards or builds, either
direction, is passed through byte for byte or refused with a 400 naming the header — never a 500
and never a request that silently does not go out (issue 8 class 6)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.config.schema import Backend
from prefixgate.proxy.core.errors import InvalidHeader, MissingBackendKey
from prefixgate.proxy.http.headers import upstream_headers, wire_value
from tests.proxy.upstream import Script, completion

UTF8 = "Agent/1.0 (café; 日本)".encode()      # multi-byte UTF-8: decodes past U+00FF
LATIN1 = b"Agent/1.0 (caf\xe9)"                # one byte 0xE9: not valid UTF-8 at all
ANTHROPIC_ANSWER = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                    "usage": {"input_tokens": 1, "output_tokens": 1}}


def _seen_bytes(rig: Any, name: str) -> bytes:
    return rig.upstream.seen[-1].headers[name].encode("latin-1")  # Starlette decodes latin-1


@pytest.mark.parametrize("header", ["user-agent", "x-stainless-os", "x-stainless-runtime-version",
                                    "x-request-id", "openai-organization", "idempotency-key"])
@pytest.mark.parametrize("value", [UTF8, LATIN1], ids=["utf8", "latin1"])
def test_openai_forwarded_header_with_non_ascii_bytes_reaches_upstream_byte_exact(
        rig: Any, header: str, value: bytes) -> None:
    rig.upstream.script = Script(body=completion())
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, headers={header: value},
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert _seen_bytes(rig, header) == value


@pytest.mark.parametrize("header", ["anthropic-beta", "user-agent", "x-stainless-lang"])
def test_anthropic_forwarded_header_with_non_ascii_bytes_reaches_upstream_byte_exact(
        rig: Any, header: str) -> None:
    rig.upstream.script = Script(body=ANTHROPIC_ANSWER)
    r = httpx.post(rig.url + "/v1/messages", timeout=30, headers={header: UTF8},
                   json={"model": "claude-x", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert _seen_bytes(rig, header) == UTF8


def test_bridged_request_with_non_ascii_user_agent_is_sent(rig: Any) -> None:
    # an OpenAI client to an Anthropic backend: the bridge path builds its headers too
    rig.upstream.script = Script(body=ANTHROPIC_ANSWER)
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30, headers={"user-agent": UTF8},
                   json={"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert _seen_bytes(rig, "user-agent") == UTF8


@pytest.mark.parametrize("value", [UTF8, LATIN1], ids=["utf8", "latin1"])
@pytest.mark.parametrize("header", ["x-request-id", "x-ratelimit-note"])
def test_upstream_response_header_with_non_ascii_bytes_reaches_client_byte_exact(
        rig: Any, header: str, value: bytes) -> None:
    # not named by the issue: the client-bound direction (request ids, rate-limit headers)
    rig.upstream.script = Script(body=completion(), headers={header: value.decode("latin-1")})
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert dict(r.headers.raw)[header.encode()] == value


def test_upstream_error_with_utf8_content_type_is_relayed_not_a_500(rig: Any) -> None:
    # not named by the issue: the upstream's content-type on its own error answer
    ctype = "application/json; note=é日".encode()
    rig.upstream.script = Script(body={"error": {"message": "slow down"}}, status=429,
                                 headers={"content-type": ctype.decode("latin-1")})
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 429
    assert r.json()["error"]["message"] == "slow down"


def test_streamed_answer_with_utf8_response_header_is_relayed(rig: Any) -> None:
    rid = "stream-é日".encode()
    rig.upstream.script = Script(pieces=[b'data: {"choices":[]}\n\n', b"data: [DONE]\n\n"],
                                 headers={"x-request-id": rid.decode("latin-1")})
    r = httpx.post(rig.url + "/v1/chat/completions", timeout=30,
                   json={"model": "gpt-x", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    assert dict(r.headers.raw)[b"x-request-id"] == rid


@pytest.mark.parametrize("value", ["naïve 日本", "a\nb", "a\rb", "nul\x00"])
def test_header_value_that_cannot_be_sent_is_refused_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidHeader) as ei:
        wire_value("x-stainless-os", value)
    assert ei.value.status == 400 and ei.value.param == "x-stainless-os"
    assert "x-stainless-os" in ei.value.message


def test_latin1_text_round_trips_to_its_original_bytes() -> None:
    assert wire_value("user-agent", UTF8.decode("latin-1")) == UTF8


def test_backend_key_that_cannot_be_sent_is_a_shaped_500_not_a_crash() -> None:
    b = Backend(kind="openai_compat", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(MissingBackendKey) as ei:
        upstream_headers([], b, "sk-日本")
    assert "sk-" not in ei.value.message  # the key itself is never quoted
