"""Read and check a client's request body, once (cases B19 and the bad-input cases).

:func:`read_body` enforces ``policy.max_body_bytes`` before and while reading (413, B19);
:func:`parse_json` parses once (key order kept; numbers keep their exact text, see
:mod:`prefixgate.proxy.core.exactjson`);
:func:`check_openai` / :func:`check_anthropic` check only what the proxy itself relies on
(``model``, ``messages``, ``stream``, Anthropic ``max_tokens``) and raise
:class:`~prefixgate.proxy.core.errors.InvalidRequest` (400) naming the offending ``param``. Everything else is
the upstream's business and passes through untouched.

Bounds applied before any pass or bridge runs (issue 8, HTTP hygiene):

- :func:`check_nesting`: the parsed body may nest arrays / objects at most
  ``limits.max_json_depth`` levels (default 128), see :mod:`prefixgate.proxy.core.nesting`.
- :func:`read_body_within`: the body must arrive within ``limits.body_timeout_s`` seconds of
  the handler starting (a slow or stalled upload is a 408 in the caller's shape); uvicorn times
  out neither slow headers nor slow bodies by itself (see :mod:`prefixgate.proxy.http.server` for the
  headers).
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from prefixgate.proxy.core import exactjson
from prefixgate.proxy.core.errors import (
    BodyTooLarge,
    ClientDisconnected,
    InvalidJSON,
    InvalidRequest,
    NestingTooDeep,
    RequestTimeout,
)
from prefixgate.proxy.core.nesting import deeper_than, describe_path, first_too_deep


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; BodyTooLarge when ``Content-Length`` or the bytes read exceed ``limit``,
    ClientDisconnected when the client goes away before the body is complete."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body of {int(declared)} bytes exceeds the proxy's limit of "
                           f"{limit} bytes (policy max_body_bytes).")
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"Request body exceeds the proxy's limit of {limit} bytes "
                                   "(policy max_body_bytes).")
            parts.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected(f"The client went away after {size} bytes of its request "
                                 "body.") from None
    return b"".join(parts)


def parse_json(raw: bytes) -> dict[str, Any]:
    """Parse a JSON object, every number kept with its exact text
    (:func:`prefixgate.proxy.core.exactjson.loads`: orjson's speed unless the body holds a number orjson
    would rewrite, e.g. an integer beyond
    64 bits or ``1.10``). InvalidJSON (400) for bad JSON or a non-object top level."""
    try:
        body = exactjson.loads(raw)
    except ValueError as e:  # orjson.JSONDecodeError, bad UTF-8, too deep for the exact parser
        raise InvalidJSON(f"We could not parse the JSON body of your request: {e}") from None
    if not isinstance(body, dict):
        raise InvalidJSON("The request body must be a JSON object.")
    return body


async def parse_json_off_loop(raw: bytes) -> dict[str, Any]:
    """:func:`parse_json`, in a worker thread for a body above :data:`OFF_LOOP_BYTES`: orjson's
    parse and the numbers' proof of a 30 MB body held the event loop (``/healthz``) 1.1 s; in a
    thread the loop runs between their steps (issue 34 item 15)."""
    if len(raw) > OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(parse_json, raw)
    return parse_json(raw)


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), (
        "integer" if isinstance(v, int) else "number" if isinstance(v, float)  # exact numbers
        else type(v).__name__))


def _require(body: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in body:
        raise InvalidRequest(f"Missing required parameter: '{key}'.", param=key,
                             code="missing_required_parameter")
    v = body[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise InvalidRequest(f"Invalid type for '{key}': expected {what}, but got "
                             f"{_type_name(v)}.", param=key, code="invalid_type")
    return v


def _check_messages(msgs: list[Any]) -> None:
    if not msgs:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages",
                             code="invalid_value")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise InvalidRequest(f"Invalid type for 'messages[{i}]': expected an object, but got "
                                 f"{_type_name(m)}.", param=f"messages[{i}]", code="invalid_type")
        if not isinstance(m.get("role"), str):
            raise InvalidRequest(f"Missing or invalid 'messages[{i}].role': expected a string.",
                                 param=f"messages[{i}].role", code="invalid_type")


def _check_stream(body: dict[str, Any]) -> None:
    s = body.get("stream")
    if s is not None and not isinstance(s, bool):
        raise InvalidRequest(f"Invalid type for 'stream': expected a boolean, but got "
                             f"{_type_name(s)}.", param="stream", code="invalid_type")


def _check_stream_options(body: dict[str, Any]) -> None:
    # the O->A bridge reads stream_options.include_usage: checked here, before any send
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise InvalidRequest(f"Invalid type for 'stream_options': expected an object, but got "
                             f"{_type_name(so)}.", param="stream_options", code="invalid_type")


def check_openai(body: dict[str, Any]) -> None:
    """Chat Completions body: ``model`` string, ``messages`` non-empty array of objects with a
    string ``role``, ``stream`` boolean and ``stream_options`` object (or null) if present.
    Raises InvalidRequest."""
    _require(body, "model", str, "a string")
    _check_messages(_require(body, "messages", list, "an array"))
    _check_stream(body)
    _check_stream_options(body)


def check_anthropic(body: dict[str, Any]) -> None:
    """Messages body: ``model`` string, ``max_tokens`` integer, ``messages`` array of objects
    with a string ``role``, ``stream`` boolean if present. Raises InvalidRequest."""
    _require(body, "model", str, "a string")
    _require(body, "max_tokens", int, "an integer")
    _check_messages(_require(body, "messages", list, "an array"))
    _check_stream(body)


def is_stream(body: dict[str, Any]) -> bool:
    """Whether the client asked for SSE."""
    return body.get("stream") is True


OFF_LOOP_BYTES = 1 << 20  # bodies above this are walked in a worker thread


async def check_nesting(body: Any, max_depth: int, size: int = 0) -> None:
    """Raise NestingTooDeep (400; ``param`` = where the limit was passed) when ``body`` nests
    deeper than ``max_depth`` levels (policy ``limits.max_json_depth``). ``size``: the body's
    length in bytes; above :data:`OFF_LOOP_BYTES` the walk (~0.6 x orjson's parse time, ~100 ms
    for a 28 MB body of 50,000 messages) runs in a worker thread, not on the event loop. The
    yes / no comes from :func:`~prefixgate.proxy.core.nesting.deeper_than`; the path of the
    first too-deep value, for the error, only when there is one."""
    if size > OFF_LOOP_BYTES:
        too_deep = await anyio.to_thread.run_sync(deeper_than, body, max_depth)
    else:
        too_deep = deeper_than(body, max_depth)
    path = first_too_deep(body, max_depth) if too_deep else None
    if path is not None:
        name, where = describe_path(path)
        raise NestingTooDeep(f"The request body nests arrays / objects more than {max_depth} "
                             f"levels deep (at {where}); the proxy's limit is {max_depth} "
                             "(policy limits.max_json_depth).", param=name)


async def read_body_within(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """:func:`prefixgate.proxy.http.body.read_body` under a deadline of ``timeout_s`` seconds. Raises
    RequestTimeout (408) when the body is not complete in time, plus whatever read_body
    raises (413 BodyTooLarge, 499 ClientDisconnected)."""
    try:  # asyncio's own timeout: anyio's cancel scope cost ~25 us a request (issue 25)
        async with asyncio.timeout(timeout_s):
            return await read_body(request, max_bytes)
    except TimeoutError:
        raise RequestTimeout(f"The request body was not received within {timeout_s:g} seconds "
                             "(policy limits.body_timeout_s).") from None


def check_model_stream(body: dict[str, Any]) -> None:
    """A side endpoint's body (``/v1/embeddings``, ``/v1/completions``, count_tokens):
    ``model`` a string, ``stream`` a boolean if present. Raises InvalidRequest."""
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("Missing or invalid 'model': expected a string.", param="model",
                             code="missing_required_parameter")
    _check_stream(body)
