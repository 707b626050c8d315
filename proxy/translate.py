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
    """The client's body in the backend's API.

    Raises InvalidRequest (400) when a field the bridge maps has a type it cannot translate
    (``stop: 5``, ``tools: 5``, ``tool_calls: "abc"``, a text block whose text is a number):
    the backend would reject such a field too, and it is the client's error, not the proxy's.
    """
    try:
        return a2o.request_to_openai(body) if client_api == "anthropic" else (
            o2a.request_to_anthropic(body))
    except (TypeError, AttributeError, ValueError) as e:
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
    include = bool((body.get("stream_options") or {}).get("include_usage"))
    return o2a.ChunkMapper(model, watcher, include).map
