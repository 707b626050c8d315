"""A hostile upstream for adversarial proxy tests: each model name picks a misbehaviour.

``HostileUpstream().app()`` answers ``POST /v1/chat/completions`` and ``POST /v1/messages``:

- ``wrong-shape``: 200 JSON of the wrong shape (``{"choices": 5, "content": 5, "usage": "x"}``)
- ``garbage-stream``: SSE events that are not JSON, JSON scalars, or objects of the wrong shape,
  then a proper end (``[DONE]`` / ``message_stop``)
- ``cut-stream``: one content event, then the connection is dropped
- ``hang-stream``: one content event, then silence for ``hang_s`` seconds

``GET /v1/models`` answers ``models_body`` (whatever JSON a test sets).

``closed`` counts streams whose client (the proxy) went away first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.proxy.upstream import DONE, chunk

ANTHROPIC_TEXT = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                  b'"delta":{"type":"text_delta","text":"a"}}\n\n')
ANTHROPIC_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'

GARBAGE_EVENTS = [b"data: {not json\n\n", b"data: 5\n\n", b'data: "text"\n\n',
                  b'data: {"choices": 5, "usage": 7}\n\n',
                  b'data: {"choices": [5, {"delta": 3}, {"delta": {"tool_calls": 4}}]}\n\n',
                  b'event: message_start\ndata: {"type":"message_start","message":5}\n\n',
                  b'event: content_block_start\ndata: {"type":"content_block_start",'
                  b'"content_block":5}\n\n',
                  b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                  b'"delta":5}\n\n',
                  b'event: message_delta\ndata: {"type":"message_delta","delta":7,'
                  b'"usage":5}\n\n',
                  b"event: x\n\n", b"\xff\xfe\n\n"]


@dataclass
class HostileUpstream:
    """See module docstring."""

    hang_s: float = 5.0
    closed: int = 0
    models_body: Any = None

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            body = json.loads(await request.body())
            anthropic = request.url.path.endswith("/messages")
            model = body["model"].removeprefix("claude-")
            if model == "wrong-shape":
                return Response(json.dumps({"choices": 5, "content": 5, "usage": "x"}),
                                media_type="application/json")
            first = ANTHROPIC_TEXT if anthropic else chunk("a")
            end = ANTHROPIC_STOP if anthropic else DONE
            return StreamingResponse(self._stream(model, first, end),
                                     media_type="text/event-stream")

        async def models(request: Request) -> Response:
            return Response(json.dumps(self.models_body), media_type="application/json")

        return Starlette(routes=[Route("/v1/chat/completions", handle, methods=["POST"]),
                                 Route("/v1/messages", handle, methods=["POST"]),
                                 Route("/v1/models", models)])

    async def _stream(self, model: str, first: bytes, end: bytes) -> AsyncIterator[bytes]:
        try:
            yield first
            if model == "garbage-stream":
                for ev in GARBAGE_EVENTS:
                    yield ev
                yield first
                yield end
            elif model == "cut-stream":
                yield first[:15]
                raise RuntimeError("upstream died mid-stream")
            elif model == "hang-stream":
                await asyncio.sleep(self.hang_s)
                yield end
        except (asyncio.CancelledError, GeneratorExit):
            self.closed += 1
            raise
