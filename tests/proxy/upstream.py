"""A scripted upstream for proxy tests: a small Starlette app that records what reached it.

``ScriptedUpstream`` answers ``POST /v1/chat/completions`` and ``POST /v1/messages`` with
whatever ``script`` says: a list of byte pieces sent with a delay before each (a stream), or a
JSON body with a status. Every request's headers and body are kept in ``seen``; ``closed``
counts streams whose client (the proxy) went away before the script finished.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Script:
    """``pieces``: bytes to stream (each after ``delay_s``), or None for a JSON answer
    ``body`` with ``status``."""

    pieces: list[bytes] | None = None
    delay_s: float = 0.0
    body: Any = None
    status: int = 200
    media_type: str = "text/event-stream"
    headers: dict[str, str] | None = None


@dataclass
class Seen:
    """One request as the upstream received it."""

    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


@dataclass
class ScriptedUpstream:
    """See module docstring. Set ``script`` before each request (or a callable of the body)."""

    script: Any = field(default_factory=Script)
    seen: list[Seen] = field(default_factory=list)
    closed: int = 0
    finished: int = 0

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            raw = await request.body()
            self.seen.append(Seen(request.url.path, {k.lower(): v for k, v in
                                                    request.headers.items()}, raw))
            script = self.script(json.loads(raw or b"null")) if callable(self.script) else (
                self.script)
            if script.pieces is None:
                return Response(json.dumps(script.body).encode(), status_code=script.status,
                                media_type="application/json", headers=script.headers)
            return StreamingResponse(self._stream(script), status_code=script.status,
                                     media_type=script.media_type, headers=script.headers)

        async def models(request: Request) -> Response:
            return Response(json.dumps({"object": "list", "data": [
                {"id": "scripted-model", "object": "model"}]}), media_type="application/json")

        return Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"]),
                                 Route("/v1/messages", handle, methods=["POST"]),
                                 Route("/v1/responses", handle, methods=["POST"]),
                                 Route("/v1/responses/{rid}", handle, methods=["GET", "DELETE"]),
                                 Route("/v1/embeddings", handle, methods=["POST"]),
                                 Route("/v1/completions", handle, methods=["POST"]),
                                 Route("/v1/messages/count_tokens", handle, methods=["POST"]),
                                 Route("/v1/models", models)])

    async def _stream(self, script: Script):  # type: ignore[no-untyped-def]
        try:
            for piece in script.pieces or []:
                if script.delay_s:
                    await asyncio.sleep(script.delay_s)
                yield piece
            self.finished += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.closed += 1
            raise


def chunk(content: str | None = None, *, finish: str | None = None, usage: Any = None,
          tool_args: str | None = None, cid: str = "chatcmpl-1") -> bytes:
    """One OpenAI Chat Completions SSE event (``data: {...}\\n\\n``)."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_args is not None:
        delta["tool_calls"] = [{"index": 0, "function": {"arguments": tool_args}}]
    obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 1,
                           "model": "m", "choices": [] if usage else
                           [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def completion(text: str = "hi", usage: Any = None) -> dict[str, Any]:
    """A non-streamed Chat Completion body."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                               "prompt_tokens_details": {"cached_tokens": 4}}}


def wait_rows(ledger: Any, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The ledger's rows once there are at least ``n``. A streamed request's row is written
    just after its last byte (after the break / counterfactual analysis), so a client that has
    read ``[DONE]`` may look a few milliseconds too early."""
    import time

    deadline = time.monotonic() + timeout_s
    rows = ledger.rows()
    while len(rows) < n and time.monotonic() < deadline:
        time.sleep(0.02)
        rows = ledger.rows()
    assert len(rows) >= n, f"ledger has {len(rows)} rows, expected {n}"
    return rows  # type: ignore[no-any-return]
