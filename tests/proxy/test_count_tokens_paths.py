"""``POST /v1/messages/count_tokens`` over every backend kind and every way the count can come
back (issue 38: the endpoint's tests held one configuration each — an Anthropic backend and an
OpenAI-compatible one without ``/tokenize`` — and a count "between 6 and 30").

The dimension varied: the routed backend's kind (Anthropic: passed through, never rewritten;
a kind that tokenizes: its ``/tokenize``, exact; one that does not: estimated), how ``/tokenize``
answers (a count, 404, 500), the body's model (its vocabulary), and bad bodies (their error in
Anthropic's shape, naming the field).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixgate.proxy.api.count_tokens import check, estimate
from prefixgate.proxy.core.errors import InvalidRequest
from prefixgate.proxy.pipeline.rewrite import default_rewrite_fn
from tests.proxy.upstream import Script
from tests.servers import serve_app

LONG_SYSTEM = "You are a careful assistant who follows the house style. " * 200  # > 1024 tokens
BODY = {"model": "claude-x", "system": LONG_SYSTEM,
        "messages": [{"role": "user", "content": "How many tokens is this?"}]}


class Tokenizer:
    """An engine's ``POST /tokenize``: answers ``status`` with ``{"count": count}``."""

    def __init__(self) -> None:
        self.status, self.count, self.seen = 200, 17, 0

    def app(self) -> Starlette:
        async def tokenize(request: Request) -> Response:
            self.seen += 1
            await request.body()
            if self.status != 200:
                return JSONResponse({"error": {"message": "nope"}}, status_code=self.status)
            return JSONResponse({"count": self.count})
        return Starlette(routes=[Route("/tokenize", tokenize, methods=["POST"])])


@pytest.fixture
def engine() -> Iterator[tuple[Tokenizer, str]]:
    t = Tokenizer()
    with serve_app(t.app()) as url:
        yield t, url


def test_an_anthropic_backend_counts_the_body_exactly_as_the_client_sent_it(rig_factory: Any) -> None:
    """The rewrite passes would place a cache breakpoint on this long system prompt: a count
    request is not a model call and goes out untouched."""
    rig = rig_factory(rewrite_fn=default_rewrite_fn())
    rig.upstream.script = Script(body={"input_tokens": 1234})
    raw = json.dumps(BODY).encode()
    r = httpx.post(rig.url + "/v1/messages/count_tokens", content=raw, timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == {"input_tokens": 1234}
    assert rig.upstream.seen[-1].path == "/v1/messages/count_tokens"
    assert rig.upstream.seen[-1].raw == raw
    assert "x-prefixgate-token-count" not in r.headers  # Anthropic's own count: no mark


@pytest.mark.parametrize("status, header, estimated", [(200, "exact", False), (404, "estimated", True)])
def test_a_kind_that_tokenizes_counts_exactly_or_estimates_without_tokenize(
        rig_factory: Any, engine: tuple[Tokenizer, str], status: int, header: str,
        estimated: bool) -> None:
    tok, url = engine
    tok.status = status
    rig = rig_factory(backends={"eng": {"kind": "openai_compat", "base_url": url + "/v1"}},
                      routes=[{"match": "*", "backend": "eng"}])
    body = {**BODY, "model": "local-model"}
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json=body, timeout=10)
    assert r.status_code == 200 and tok.seen == 1
    assert r.headers["x-prefixgate-token-count"] == header
    if estimated:
        assert r.json() == {"input_tokens": estimate(body), "estimated": True}
    else:
        assert r.json() == {"input_tokens": 17}


def test_a_tokenize_that_fails_is_not_marked_exact(rig_factory: Any,
                                                   engine: tuple[Tokenizer, str]) -> None:
    tok, url = engine
    tok.status = 500
    rig = rig_factory(backends={"eng": {"kind": "openai_compat", "base_url": url + "/v1"}},
                      routes=[{"match": "*", "backend": "eng"}])
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json={**BODY, "model": "local-model"},
                   timeout=30)
    assert r.status_code >= 500 and r.json()["type"] == "error"
    assert r.headers.get("x-prefixgate-token-count") != "exact"


def test_a_kind_that_cannot_count_gets_the_estimate_in_its_models_vocabulary(
        rig_factory: Any, upstream: Any) -> None:
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": upstream[1] + "/v1"}},
                      routes=[{"match": "*", "backend": "oai"}])
    for model in ("gpt-4o", "gpt-4"):  # o200k and cl100k: the estimate follows the model
        body = {**BODY, "model": model, "system": "Ünïcödé 文字 " * 40}
        r = httpx.post(rig.url + "/v1/messages/count_tokens", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-prefixgate-token-count"] == "estimated"
        assert r.json() == {"input_tokens": estimate(body), "estimated": True}
    assert not rig.upstream.seen  # nothing was sent upstream
    a = estimate({**BODY, "model": "gpt-4o", "system": "Ünïcödé 文字 " * 40})
    b = estimate({**BODY, "model": "gpt-4", "system": "Ünïcödé 文字 " * 40})
    assert a != b  # the two vocabularies really differ on this text


@pytest.mark.parametrize("messages", ["hello", {"role": "user"}, None, 3])
def test_messages_that_are_not_an_array_are_a_400_naming_the_field(rig: Any, messages: Any) -> None:
    body: dict[str, Any] = {"model": "claude-x"}
    if messages is not None:
        body["messages"] = messages
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json=body, timeout=10)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"] == "Missing or invalid 'messages': expected an array."
    assert not rig.upstream.seen


def test_only_post_is_served(rig: Any) -> None:
    assert httpx.get(rig.url + "/v1/messages/count_tokens", timeout=10).status_code in (404, 405)
    assert httpx.post(rig.url + "/v1/messages/count_tokens", timeout=10,
                      json={"model": "claude-x", "messages": []}).status_code != 405


def test_estimate_without_a_message_list_counts_no_role_markers() -> None:
    assert estimate({"model": "gpt-4", "system": "abc"}) == estimate(
        {"model": "gpt-4", "system": "abc", "messages": None})
    assert estimate({"model": "gpt-4", "system": "abc", "messages": "xyz"}) > estimate(
        {"model": "gpt-4", "system": "abc"})  # counted as text, no role markers (0 messages)


@pytest.mark.parametrize("messages", ["hello", {"role": "user"}, None, 3])
def test_the_check_names_the_field_and_its_error_code(messages: Any) -> None:
    """The exception names ``messages`` and ``invalid_type``: Anthropic's error shape shows only
    the message, so the field and code are held here, where they are set."""
    body: dict[str, Any] = {"model": "claude-x"}
    if messages is not None:
        body["messages"] = messages
    with pytest.raises(InvalidRequest) as err:
        check(body)
    assert (err.value.param, err.value.code, err.value.status) == ("messages", "invalid_type", 400)
    check({"model": "claude-x", "messages": []})  # an array passes
