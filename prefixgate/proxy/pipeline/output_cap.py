"""Bounded defaults: a request that names no output cap gets its route's (issue 11, item 4).

An OpenAI client may leave ``max_tokens`` out (LangChain does); our engine, vLLM and SGLang then
decode until the context is full, which on a CPU holds the engine for minutes. The policy's
``default_max_tokens`` (or the route's own, see :class:`prefixgate.config.schema.Route`) is written into
such a body before the passes run, under the field the backend reads:

- Chat Completions to an ``openai`` backend: ``max_completion_tokens`` (OpenAI deprecates
  ``max_tokens``, and its reasoning models refuse it); to any other backend: ``max_tokens``.
- Responses: ``max_output_tokens``; legacy Completions: ``max_tokens``.
- Anthropic Messages: nothing (``max_tokens`` is required there; a body without it is a 400).

A body that names a cap (any of the fields, even ``null``-free) is sent as the client wrote it.
"""

from __future__ import annotations

from typing import Any

from prefixgate.config.backend_kinds import traits
from prefixgate.config.schema import Policy
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.routing.router import Target

_CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def route_cap(policy: Policy, target: Target) -> int:
    """The cap (tokens) for requests routed to ``target``: its route's ``default_max_tokens``,
    else the policy's; 0 = none."""
    for r in policy.routes:
        if r.match == target.route and r.backend == target.backend_name:
            if r.default_max_tokens is not None:
                return r.default_max_tokens
            break
    return policy.default_max_tokens


def cap_field(wire_api: str, target: Target) -> str | None:
    """The body field that carries the cap for a client of ``wire_api`` (``openai``,
    ``responses``, ``completions`` or ``anthropic``) going to ``target``; None when the API has no default."""
    if wire_api == "responses":
        return "max_output_tokens"
    if wire_api == "completions":  # the legacy Completions API has only max_tokens
        return "max_tokens"
    if wire_api == "anthropic":
        return None
    return traits(target.backend.kind).output_cap_field or "max_tokens"


def with_default_cap(body: dict[str, Any], raw: bytes, wire_api: str, target: Target,
                     policy: Policy) -> tuple[dict[str, Any], bytes]:
    """``(body, raw)`` with the route's cap added when the body names none; the same objects
    when nothing is added (so an untouched body still goes out byte for byte)."""
    field = cap_field(wire_api, target)
    cap = route_cap(policy, target)
    if field is None or cap <= 0 or any(body.get(f) is not None for f in _CAP_FIELDS):
        return body, raw
    capped = {**body, field: cap}
    return capped, exactjson.dumps(capped)
