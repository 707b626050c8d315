"""The bridge interface, and the identity bridge (passthrough): how one client API meets one backend API.

One bridge object per request and target (envoyproxy/ai-gateway keeps one translator per API
pair, passthrough included, so the pipeline never branches on "translate or not"). It owns
every mapping between the two APIs:

- the request: :meth:`Bridge.pass_body` (what the rewriter's passes read, in
  :attr:`Bridge.pass_api`) and :meth:`Bridge.encode` (the upstream bytes; 400 before anything
  is sent for what the backend's API cannot carry); :meth:`Bridge.url` (where it goes);
- the non-streamed answer (:meth:`Bridge.answer`, usage included), the upstream's error body
  (:meth:`Bridge.error`), and the stream (:meth:`Bridge.stream`: the usage watcher and the
  event mapper; :meth:`Bridge.end_mapper`: the relay's own closing error in the client's
  events).

The pairs (:func:`prefixgate.proxy.bridges.bridge_for`'s table): :class:`Bridge` (identity, any API,
any endpoint path), Anthropic -> OpenAI (:mod:`prefixgate.proxy.bridges.anthropic_openai`), OpenAI ->
Anthropic (:mod:`prefixgate.proxy.bridges.openai_anthropic`), Responses -> Chat
(:mod:`prefixgate.proxy.bridges.responses_chat`, and over Anthropic through the O->A bridge), and the
Responses identity (:mod:`prefixgate.proxy.bridges.responses_identity`). A new pair is one file and
one row of the table.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import orjson

from prefixgate.proxy.bridges.validity import encoded
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import InvalidRequest
from prefixgate.proxy.core.sse import EventMapper
from prefixgate.proxy.core.usage import (
    AnthropicStreamWatcher,
    OpenAIStreamWatcher,
    StreamWatcher,
    Usage,
    usage_from_answer,
)

#: The APIs a client or a backend speaks: Chat Completions (and its side endpoints), Messages,
#: Responses.
BridgeApi = Literal["openai", "anthropic", "responses"]


class Rewritten(Protocol):
    """What the rewriter's passes made of :meth:`Bridge.pass_body` (the pipeline's
    ``RewriteOutcome``): the body and its bytes."""

    body: dict[str, Any]
    raw: bytes


class Bridge:
    """The identity bridge: client and backend both speak ``client`` at ``path``
    (``/chat/completions``, ``/messages``, ``/embeddings``, ``/completions``,
    ``/messages/count_tokens``); base of the translating ones.

    ``wire``: the backend's API; ``translate``: whether the two differ; ``pass_api``: the API
    of :meth:`pass_body` (None: no pass applies to this endpoint).
    """

    translate = False

    def __init__(self, client: BridgeApi, wire: BridgeApi, path: str,
                 passes: bool = True) -> None:
        self.client, self.wire, self.path = client, wire, path
        self.pass_api: Literal["openai", "anthropic"] | None = (
            client if passes and client != "responses" else None)  # type: ignore[assignment]

    def url(self, base_url: str) -> str:
        """Where the request goes on a deployment whose API root is ``base_url``."""
        return base_url + self.path

    def pass_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body the rewriter's passes read (in :attr:`pass_api`), None when none apply."""
        return body if self.pass_api is not None else None

    def request(self, body: dict[str, Any], max_depth: int) -> dict[str, Any]:
        """The client's ``body`` in the backend's API, as a dict (identity: itself)."""
        return body

    def encode(self, body: dict[str, Any], raw: bytes, rewritten: Rewritten | None,
               model: str | None, max_depth: int) -> bytes:
        """The upstream bytes: from ``rewritten`` (the passes' output over :meth:`pass_body`)
        when given, else from the client's ``body`` / ``raw``; ``model``: a model name to send
        instead of the client's (None: keep). Raises InvalidRequest / NestingTooDeep (400) for
        what the backend's API cannot carry."""
        if rewritten is not None:
            body, raw = rewritten.body, rewritten.raw
        if model is None:
            return raw
        return dumps({**body, "model": model})

    def stream(self, model: str, body: dict[str, Any]) -> tuple[StreamWatcher, EventMapper | None]:
        """The usage watcher of the backend's stream and the mapper of its events into the
        client's (None: relay the bytes). ``model``: the name the client's events carry."""
        watcher = AnthropicStreamWatcher() if self.wire == "anthropic" else OpenAIStreamWatcher()
        return watcher, None

    def end_mapper(self, watcher: StreamWatcher) -> EventMapper | None:
        """Maps the relay's own closing error event (Chat- or Messages-shaped) into the client's
        stream events; None: sent as it is."""
        return None

    def stream_done(self, watcher: StreamWatcher, status: str) -> None:
        """The stream ended with ``status`` (``ok``, ``upstream_error``, ...): nothing to do for
        most bridges (the Responses identity keeps a completed response's id)."""

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


class Translating(Bridge):
    """Base of the bridges whose two sides speak different APIs: the upstream bytes are
    :meth:`request` of the (rewritten) body, serialised with numbers kept; answers are parsed
    with their numbers kept."""

    translate = True

    def encode(self, body: dict[str, Any], raw: bytes, rewritten: Rewritten | None,
               model: str | None, max_depth: int) -> bytes:
        if rewritten is not None:
            body = rewritten.body
        if model is not None:
            body = {**body, "model": model}
        return encoded(self.request(body, max_depth))

    def loads(self, content: bytes) -> Any:
        return exactjson.loads(content)


def dumps(body: dict[str, Any]) -> bytes:
    """``body`` as upstream bytes (numbers keep their text); InvalidRequest (400) when it
    cannot be written as JSON."""
    try:
        return exactjson.dumps(body)
    except TypeError as e:  # orjson.JSONEncodeError is a TypeError
        raise InvalidRequest(f"The request could not be re-serialised: {str(e)[:120]}") from None
