"""``POST /v1/messages/count_tokens`` against a backend that fails or lies: its own error keeps
its status in Anthropic's shape (a non-JSON 500 page wrapped); a ``/tokenize`` or Anthropic
count that answers 200 with something unreadable (not JSON, not an object, no / a negative /
a boolean ``count``) is a 502 in Anthropic's shape — never a 500 "internal error"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.servers import serve_app

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
ANSWERS = [(500, b"<html>boom</html>", "text/html"), (429, b"slow down", "text/plain"),
           (200, b"not json", "text/plain"), (200, b"[1, 2]", "application/json"),
           (200, b'{"count": "7"}', "application/json"),
           (200, b'{"count": -3}', "application/json"),
           (200, b'{"count": true}', "application/json"), (200, b"", "application/json")]


@pytest.fixture
def backend() -> Iterator[tuple[list[tuple[int, bytes, str]], str]]:
    answer: list[tuple[int, bytes, str]] = [ANSWERS[0]]

    async def handle(request: Request) -> Response:
        status, body, media = answer[0]
        return Response(body, status_code=status, media_type=media)

    app = Starlette(routes=[Route("/tokenize", handle, methods=["POST"]),
                            Route("/v1/messages/count_tokens", handle, methods=["POST"])])
    with serve_app(app) as url:
        yield answer, url


# a JSON object from Anthropic's own count endpoint is its answer: not a lie to catch
CASES = [(k, *a) for k in ("openai_compat", "anthropic") for a in ANSWERS
         if not (k == "anthropic" and a[1].startswith(b"{"))]


@pytest.mark.parametrize("kind,status,content,media", CASES,
                         ids=[f"{k}-{s}-{c[:12]!r}" for k, s, c, _ in CASES])
def test_a_failing_or_lying_backend_is_an_anthropic_shaped_error_never_a_500(
        rig_factory: Any, backend: Any, kind: str, status: int, content: bytes,
        media: str) -> None:
    answer, url = backend
    answer[0] = (status, content, media)
    rig = rig_factory(backends={"b": {"kind": kind, "base_url": url + "/v1"}},
                      routes=[{"match": "*", "backend": "b"}])
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json=BODY, timeout=10)
    # the backend's own error keeps its status (as on every endpoint of the pipeline: a 429
    # stays a 429 the SDK retries); an answer that is not a count is the engine failing: 502
    assert r.status_code == (status if status >= 400 else 502), r.text
    body = r.json()
    assert body["type"] == "error" and isinstance(body["error"]["message"], str)
    assert "internal" not in r.text.lower() and "Traceback" not in r.text
    assert rig.ledger.rows() == []  # not a model call


def test_a_good_count_still_passes(rig_factory: Any, backend: Any) -> None:
    answer, url = backend
    answer[0] = (200, b'{"count": 12, "max_model_len": 8192}', "application/json")
    rig = rig_factory(backends={"b": {"kind": "openai_compat", "base_url": url + "/v1"}},
                      routes=[{"match": "*", "backend": "b"}])
    r = httpx.post(rig.url + "/v1/messages/count_tokens", json=BODY, timeout=10)
    assert r.status_code == 200 and r.json() == {"input_tokens": 12}
