"""One bridge object per request: how the client's API meets its backend's (issue 10, item 1).

:func:`bridge_for` picks it from the pair (client API, backend API), as envoyproxy/ai-gateway
keeps one translator per API pair, passthrough included:

- :class:`Identity` — the same API on both sides: the (rewritten) bytes go out as they are and
  the answer, its errors and its stream come back untouched; the usage watcher reads the stream.
- :class:`AnthropicToOpenAI` — an Anthropic client on an OpenAI-compatible backend
  (:mod:`prefixgate.proxy.bridges.anthropic_openai`,
  :mod:`prefixgate.proxy.bridges.anthropic_openai_request`).
- :class:`OpenAIToAnthropic` — an OpenAI client on an Anthropic backend
  (:mod:`prefixgate.proxy.bridges.openai_anthropic`,
  :mod:`prefixgate.proxy.bridges.openai_anthropic_request`).

Each owns four mappings: the request (:meth:`Bridge.encode`, 400 before anything is sent), the
non-streamed answer (:meth:`Bridge.answer`), the upstream's error body (:meth:`Bridge.error`)
and the stream (:meth:`Bridge.stream`: the usage watcher and, when translating, the event mapper).
A new backend API is one new class here, not edits across the proxy.
"""

from __future__ import annotations

from typing import Any

import orjson

from prefixgate.proxy.bridges import translate
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import Api, InvalidRequest
from prefixgate.proxy.core.sse import EventMapper
from prefixgate.proxy.core.usage import (
    AnthropicStreamWatcher,
    OpenAIStreamWatcher,
    StreamWatcher,
    Usage,
    usage_from_answer,
)


class Bridge:
    """The identity bridge (client and backend speak ``wire``); base of the translating ones.

    ``client``: the client's API; ``wire``: the backend's; ``translate``: whether they differ.
    """

    translate = False

    def __init__(self, client: Api, wire: Api) -> None:
        self.client, self.wire = client, wire

    def encode(self, body: dict[str, Any], raw: bytes, model: str | None,
               max_depth: int) -> bytes:
        """The upstream bytes of the (rewritten) ``body`` whose bytes are ``raw``; ``model``:
        a model name to send instead of the client's (None: keep). Raises InvalidRequest /
        NestingTooDeep (400) for what the backend's API cannot carry."""
        if model is None:
            return raw
        return _dumps({**body, "model": model})

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher,
                                                               EventMapper | None]:
        """The usage watcher of the backend's stream and the mapper of its events into the
        client's (None: relay the bytes). ``model``: the name the client's events carry."""
        watcher = AnthropicStreamWatcher() if self.wire == "anthropic" else OpenAIStreamWatcher()
        return watcher, None

    def loads(self, content: bytes) -> Any:
        """Parse a non-streamed answer (raises ValueError when it is not JSON)."""
        return orjson.loads(content)

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        """(the client's bytes, the usage) of a non-streamed ``answer`` whose bytes are
        ``content``. Raises ValueError / TypeError / KeyError ... on a shape it cannot map."""
        return content, usage_from_answer(answer, self.wire)

    def error(self, raw: bytes, status: int) -> bytes | None:
        """The upstream's JSON error body in the client's shape (None: relay it as is)."""
        return None


class AnthropicToOpenAI(Bridge):
    """Anthropic client -> OpenAI-compatible backend."""

    translate = True

    def encode(self, body: dict[str, Any], raw: bytes, model: str | None,
               max_depth: int) -> bytes:
        if model is not None:
            body = {**body, "model": model}
        return translate.encode(self.client, body, max_depth)

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher,
                                                               EventMapper | None]:
        watcher = OpenAIStreamWatcher()
        return watcher, translate.mapper(self.client, model, watcher, body)

    def loads(self, content: bytes) -> Any:
        return exactjson.loads(content)

    def answer(self, answer: dict[str, Any], content: bytes, model: str) -> tuple[bytes, Usage]:
        usage = usage_from_answer(answer, self.wire)
        return exactjson.dumps(translate.response(self.client, answer, model)), usage

    def error(self, raw: bytes, status: int) -> bytes | None:
        return orjson.dumps(translate.error(self.client, raw, status))


class OpenAIToAnthropic(AnthropicToOpenAI):
    """OpenAI client -> Anthropic backend (the same calls, :mod:`prefixgate.proxy.bridges.translate` picks the
    direction from the client's API)."""

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher,
                                                               EventMapper | None]:
        watcher = AnthropicStreamWatcher()
        return watcher, translate.mapper(self.client, model, watcher, body)


def bridge_for(client: Api, wire: Api) -> Bridge:
    """The bridge for a client of ``client`` on a backend speaking ``wire``."""
    if client == wire:
        return Bridge(client, wire)
    if client == "anthropic":
        return AnthropicToOpenAI(client, wire)
    return OpenAIToAnthropic(client, wire)


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return exactjson.dumps(body)
    except TypeError as e:
        raise InvalidRequest(f"The request could not be re-serialised: {str(e)[:120]}") from None
