"""Pick the bridge for a client whose API differs from its backend's (one place for both ways).

``client_api == "anthropic"``: Anthropic client -> OpenAI-compatible backend
(:mod:`prefixgate.proxy.bridges.anthropic_openai`); ``"openai"``: OpenAI client -> Anthropic backend
(:mod:`prefixgate.proxy.bridges.openai_anthropic`). Each function takes the client's API and maps bodies,
errors and stream events from the backend's API into the client's.
"""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.bridges import anthropic_openai as a2o
from prefixgate.proxy.bridges import openai_anthropic as o2a
from prefixgate.proxy.bridges.validity import Problem, anthropic_problem, openai_problem
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import Api, InvalidRequest, quoted
from prefixgate.proxy.core.nesting import DEFAULT_MAX_JSON_DEPTH
from prefixgate.proxy.core.sse import EventMapper
from prefixgate.proxy.core.usage import AnthropicStreamWatcher, StreamWatcher


def request(client_api: Api, body: dict[str, Any],
            max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> dict[str, Any]:
    """The client's body in the backend's API: every field mapped, carried as delimited text, or
    refused (issue 8, *Translation is lossless or refuses*; the table is ``docs/bridges.md``).

    Everything the bridge and its stream mapper will read is checked here, so a bridged request
    can only fail before it is sent. Raises InvalidRequest (400, ``param`` naming the field)
    for a field it cannot carry or whose type is wrong (``stop: 5``, ``stream_options: 5``,
    a ``document`` block with a ``url`` source, ``n: 2``), and for a result the backend's API
    would reject as a whole (:mod:`prefixgate.proxy.bridges.validity`: no messages left, a tool result
    answering no call, ...; ``param`` = the client field it came from); NestingTooDeep (400)
    for tool-call arguments nested deeper than ``max_depth`` (policy
    ``limits.max_json_depth``). Serialise the result with :func:`encode` (numbers keep their
    text).
    """
    origins: dict[int, str] = {}
    try:
        out = a2o.request_to_openai(body, origins) if client_api == "anthropic" else (
            o2a.request_to_anthropic(body, max_depth, origins))
    except (TypeError, AttributeError, ValueError, KeyError) as e:  # a shape no check foresaw
        raise InvalidRequest(
            f"The request could not be translated for this model's backend: a field has an "
            f"unexpected type or shape ({type(e).__name__}: {str(e)[:120]}).") from None
    problem = anthropic_problem(out) if client_api == "openai" else openai_problem(out)
    if problem is not None:
        _refuse(problem, origins)
    return out


def _refuse(problem: Problem, origins: dict[int, str]) -> None:
    param = origins.get(id(problem.node), "messages") if problem.node is not None else "messages"
    raise InvalidRequest(f"{quoted(param)} cannot be translated for this model's backend (it speaks "
                         f"the other API): {problem.why}.", param=param,
                         code="unsupported_parameter")


def encode(client_api: Api, body: dict[str, Any], max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> bytes:
    """:func:`request` serialised with :func:`prefixgate.proxy.core.exactjson.dumps` (the upstream bytes). A
    translated body that cannot be serialised (a value JSON cannot hold, nesting past orjson's
    255 levels) is InvalidRequest (400) from the bridge step, never a 500."""
    out = request(client_api, body, max_depth)
    try:
        return exactjson.dumps(out)
    except TypeError as e:  # orjson.JSONEncodeError is a TypeError
        raise InvalidRequest(f"'messages' could not be translated for this model's backend: "
                             f"the translated body cannot be written as JSON ({str(e)[:120]}).",
                             param="messages") from None


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
