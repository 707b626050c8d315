"""The bridges' request / answer / error / stream mappings by client API, for tests: the
translating bridge of each direction (:func:`prefixgate.proxy.bridges.bridge_for`)."""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.bridges import Bridge, bridge_for
from prefixgate.proxy.core.nesting import DEFAULT_MAX_JSON_DEPTH
from prefixgate.proxy.core.sse import EventMapper
from prefixgate.proxy.core.usage import StreamWatcher


def bridge(client_api: str) -> Bridge:
    """The bridge of a ``client_api`` client on a backend of the other API."""
    return bridge_for(client_api, "openai" if client_api == "anthropic" else "anthropic")  # type: ignore[arg-type]


def request(client_api: str, body: dict[str, Any], max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, Any]:
    return bridge(client_api).request(body, max_depth)


def encode(client_api: str, body: dict[str, Any], max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> bytes:
    return bridge(client_api).encode(body, b"", None, None, max_depth)


def response(client_api: str, upstream: dict[str, Any], model: str) -> dict[str, Any]:
    from prefixgate.proxy.core import exactjson

    return exactjson.loads(bridge(client_api).answer(upstream, b"", model)[0])


def error(client_api: str, raw: bytes, status: int) -> dict[str, Any]:
    import orjson

    out = bridge(client_api).error(raw, status)
    assert out is not None
    return orjson.loads(out)


def mapper(client_api: str, model: str, watcher: StreamWatcher | None, body: dict[str, Any]) -> EventMapper:
    """The stream mapper (the bridge makes its own watcher; ``watcher`` is ignored)."""
    _, m = bridge(client_api).stream(model, body)
    assert m is not None
    return m
