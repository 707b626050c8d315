"""The Responses -> Chat bridge: a Responses API client served by a Chat Completions backend.

:class:`ResponsesToChat` is the bridge object (:mod:`prefixgate.proxy.bridges.base`): the request
items -> a Chat body (:mod:`prefixgate.proxy.bridges.responses_chat_items`, where the field table
is), the answer -> a ``response`` object, Chat chunks -> Responses stream events
(:mod:`prefixgate.proxy.bridges.responses_chat_stream`). On an Anthropic backend it runs over the
O->A bridge (:class:`~prefixgate.proxy.bridges.openai_anthropic.OpenAIToAnthropic`): Messages events
-> Chat chunks -> Responses events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prefixgate.proxy.bridges.base import Bridge, Rewritten, dumps
from prefixgate.proxy.bridges.openai_anthropic import OpenAIToAnthropic, response_to_openai
from prefixgate.proxy.bridges.responses_chat_items import (
    input_items,
    new_id,
    output_from_chat,
    response_object,
    to_chat,
    usage_object,
)
from prefixgate.proxy.bridges.responses_chat_stream import ResponsesStream
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.sse import EventMapper, SSEEvent, parse_event
from prefixgate.proxy.core.usage import (
    OpenAIStreamWatcher,
    StreamWatcher,
    Usage,
    engine_usage,
    filled_usage,
    usage_from_answer,
)

#: ``keep(response_id, response, items)``: store a finished response and the input items that
#: led to it (the endpoint's response store; the bridge itself does no I/O).
Keep = Callable[[str, dict[str, Any], list[dict[str, Any]]], None]


class ResponsesToChat(Bridge):
    """A Responses client on a Chat Completions backend, or on an Anthropic one through the O->A
    bridge (``inner``). One object per request and target: ``body`` is the client's Responses
    body, ``history`` the stored items of its ``previous_response_id`` chain, ``keep`` what
    stores the finished response (None: ``store: false``). The rewriter's passes read the Chat
    body (:attr:`pass_api` ``openai``)."""

    translate = True

    def __init__(self, body: dict[str, Any], history: list[dict[str, Any]], keep: Keep | None,
                 inner: OpenAIToAnthropic | None = None) -> None:
        super().__init__("responses", inner.wire if inner else "openai",
                         inner.path if inner else "/chat/completions")
        self.pass_api = "openai"
        self.body, self.history, self.keep, self.inner = body, history, keep, inner
        self.items = history + input_items(body)
        self._stream: ResponsesStream | None = None

    def pass_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body, self.history)

    def request(self, body: dict[str, Any], max_depth: int) -> dict[str, Any]:
        chat = to_chat(body, self.history)
        return self.inner.request(chat, max_depth) if self.inner else chat

    def encode(self, body: dict[str, Any], raw: bytes, rewritten: Rewritten | None,
               model: str | None, max_depth: int) -> bytes:
        chat = rewritten.body if rewritten is not None else to_chat(body, self.history)
        if model is not None:
            chat = {**chat, "model": model}
        if self.inner is not None:
            return self.inner.encode(chat, b"", None, None, max_depth)
        if rewritten is not None and model is None:
            return rewritten.raw
        return dumps(chat)

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher, EventMapper | None]:
        self._stream = ResponsesStream(body, new_id("resp"), on_done=self._done)
        if self.inner is None:
            return OpenAIStreamWatcher(), self._stream.map
        watcher, chunks = self.inner.stream(model, {**body, "stream_options": {"include_usage": True}})
        assert chunks is not None
        return watcher, _chained(chunks, self._stream.map)

    def end_mapper(self, watcher: StreamWatcher) -> EventMapper | None:
        return self._stream.map if self._stream is not None else None

    def loads(self, content: bytes) -> Any:
        return exactjson.loads(content)

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        usage = usage_from_answer(answer, self.wire)
        if self.inner is not None:
            answer = response_to_openai(answer, model)
        output, status = output_from_chat(answer)
        final = response_object(self.body, new_id("resp"), int(time.time()), output,
                                usage_object(filled_usage(answer.get("usage"), engine_usage(answer))), status)
        self._done(final)
        return exactjson.dumps(final), usage

    def error(self, raw: bytes, status: int) -> bytes | None:
        return self.inner.error(raw, status) if self.inner is not None else None

    def _done(self, final: dict[str, Any]) -> None:
        if self.keep is not None:
            self.keep(final["id"], final, self.items)


def _chained(first: EventMapper, second: EventMapper) -> EventMapper:
    """Two stream mappers in a row (Anthropic events -> Chat chunks -> Responses events)."""
    def both(raw: bytes, ev: SSEEvent) -> list[bytes]:
        return [out for mid in first(raw, ev) for out in second(mid, parse_event(mid))]
    return both
