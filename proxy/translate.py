"""Pick the bridge for a client whose API differs from its backend's (one place for both ways).

``client_api == "anthropic"``: Anthropic client -> OpenAI-compatible backend
(:mod:`proxy.bridge_anthropic`); ``"openai"``: OpenAI client -> Anthropic backend
(:mod:`proxy.bridge_openai`). Each function takes the client's API and maps bodies, errors and
stream events from the backend's API into the client's.
"""

from __future__ import annotations

from typing import Any

from proxy import bridge_anthropic as a2o
from proxy import bridge_openai as o2a
from proxy.errors import Api, InvalidRequest
from proxy.relay import EventMapper, StreamWatcher
from proxy.usage import AnthropicStreamWatcher


def request(client_api: Api, body: dict[str, Any]) -> dict[str, Any]:
    """The client's body in the backend's API: every field mapped, carried as delimited text, or
    refused (issue 8, *Translation is lossless or refuses*; the table is ``docs/bridges.md``).

    Everything the bridge and its stream mapper will read is checked here, so a bridged request
    can only fail before it is sent. Raises InvalidRequest (400, ``param`` naming the field)
    for a field it cannot carry or whose type is wrong (``stop: 5``, ``stream_options: 5``,
    a ``document`` block with a ``url`` source, ``n: 2``). Serialise the result with
    :func:`proxy.exactjson.dumps` so numbers keep their text.
    """
    try:
        return a2o.request_to_openai(body) if client_api == "anthropic" else (
            o2a.request_to_anthropic(body))
    except (TypeError, AttributeError, ValueError, KeyError) as e:  # a shape no check foresaw
        raise InvalidRequest(
            f"The request could not be translated for this model's backend: a field has an "
            f"unexpected type or shape ({type(e).__name__}: {str(e)[:120]}).") from None


def response(client_api: Api, upstream: dict[str, Any], model: str) -> dict[str, Any]:
    """A non-streamed backend answer in the client's API."""
    return a2o.response_to_anthropic(upstream, model) if client_api == "anthropic" else (
        o2a.response_to_openai(upstream, model))


def error(client_api: Api, raw: bytes, status: int) -> dict[str, Any]:
    """A backend error body in the client's error shape."""
    return a2o.error_to_anthropic(raw, status) if client_api == "anthropic" else (
        o2a.error_to_openai(raw, status))


def mapper(client_api: Api, model: str, watcher: StreamWatcher,
           body: dict[str, Any]) -> EventMapper:
    """Stream event mapper: backend events -> the client's events."""
    if client_api == "anthropic":
        return a2o.StreamMapper(model).map
    assert isinstance(watcher, AnthropicStreamWatcher)
    opts = body.get("stream_options")  # checked by request(): an object or absent
    include = isinstance(opts, dict) and opts.get("include_usage") is True
    return o2a.ChunkMapper(model, watcher, include).map
