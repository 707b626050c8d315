"""Cached tokens per deployment from the KV event indexes, for ``exact`` affinity (issue 24).

With events, a request costs one ``POST /tokenize`` (vLLM's endpoint, ours too: the ids exactly
as the engine renders the chat) on one deployment of the group, instead of a
``/v1/cache/match`` on each: its ids are hashed into blocks
(:mod:`prefixgate.proxy.routing.kv_hash`) and looked up in every deployment's index
(:meth:`~prefixgate.proxy.routing.kv_events.KVEventHub.matches`). None — the caller then asks
``/v1/cache/match`` or places by rendezvous — when no deployment of the group publishes events,
none of their indexes is fresh, or the tokenize call fails or passes
``affinity.match_timeout_ms``.
"""

from __future__ import annotations

import httpx
import orjson

from prefixgate.config.routing import Deployment
from prefixgate.proxy.bridges.tokenize import tokenize_body, tokenize_url
from prefixgate.proxy.core.errors import ProxyError
from prefixgate.proxy.routing.kv_events import KVEventHub
from prefixgate.proxy.routing.router import Target

MAX_TOKENIZE_BYTES = 8 << 20


def salt_of(body: dict[str, object]) -> bytes | None:
    """The request's ``cache_salt`` as the engines key their blocks by (None without one)."""
    salt = body.get("cache_salt")
    return salt.encode() if isinstance(salt, str) and salt else None


async def event_matches(client: httpx.AsyncClient, hub: KVEventHub, target: Target,
                        deps: list[Deployment], body: bytes) -> list[int] | None:
    """Cached tokens of the upstream ``body`` (Chat Completions bytes) on each of ``deps`` by
    their KV events, or None (module docstring). Never raises (cancellation excepted)."""
    if not hub.covers(deps):
        return None
    try:
        chat = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(chat, dict) or not isinstance(chat.get("messages"), list):
        return None
    dep = next(d for d in deps if d.name in hub.streams)
    headers = {"content-type": "application/json"}
    try:
        key = target.on(dep).api_key()
    except ProxyError:
        key = None
    if key:
        headers["authorization"] = f"Bearer {key}"
    try:
        r = await client.post(tokenize_url(dep.base_url), headers=headers,
                              content=orjson.dumps(tokenize_body(chat, add_generation_prompt=True)),
                              timeout=target.backend.affinity.match_timeout_ms / 1e3)
        if r.status_code != 200 or len(r.content) > MAX_TOKENIZE_BYTES:
            return None
        ids = r.json().get("tokens")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < 1 << 32 for t in ids):
        return None
    await hub.refresh_shared(deps)
    return hub.matches(deps, ids, salt_of(chat))
