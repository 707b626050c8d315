"""Session memory in Redis, shared by proxy replicas, served on local state when Redis is down.

:class:`SharedSessionStore` keeps one JSON value per session under ``<prefix>session:<id>``
(expiring after ``ttl_s`` idle seconds) through ``redis.asyncio``
(:class:`prefixgate.cache.state.redis_link.RedisLink`: no blocking call on the event loop, short
timeouts, one log line per outage, metrics, automatic recovery). Every merge also goes into an
in-process :class:`~prefixgate.cache.state.session.MemorySessionStore`, which answers while Redis is
down and for a session Redis does not know (one written during an outage), so a request never waits
on or fails for Redis.

``amerge`` is an optimistic transaction (WATCH / MULTI, retried on a conflict), so two replicas
merging into one session keep each other's keys. A value is at most ``max_value_bytes`` of JSON (its
largest keys dropped to fit, :func:`prefixgate.cache.state.session.fit`); Redis's own ``maxmemory``
bounds the total.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.cache.state.session import DEFAULT_MAX_SESSION_BYTES, MemorySessionStore, fit, json_bytes

log = logging.getLogger("prefixgate.sessions")

DEFAULT_TTL_S = 24 * 3600
MAX_WATCH_RETRIES = 16
"""Conflicting merges into one session retried at most this often (then the merge is kept
locally only, and logged)."""

_DOWN: Any = object()  # fallback marker: Redis did not answer


class SharedSessionStore:
    """Session memory in Redis behind ``link``, with ``local`` as the outage fallback.

    Sync :meth:`get` / :meth:`merge` (the :class:`~prefixgate.cache.state.session.SessionStore`
    protocol) touch only the local store; the proxy calls :meth:`aget` / :meth:`amerge`."""

    def __init__(self, link: RedisLink, local: MemorySessionStore | None = None,
                 ttl_s: int = DEFAULT_TTL_S,
                 max_value_bytes: int = DEFAULT_MAX_SESSION_BYTES) -> None:
        self.link = link
        self.local = local if local is not None else MemorySessionStore()
        self.ttl_s = ttl_s
        self.max_value_bytes = max_value_bytes

    def _key(self, session_id: str) -> str:
        return self.link.key("session", session_id)

    def get(self, session_id: str) -> Mapping[str, Any]:
        """The local copy of the session's memory (no Redis round trip)."""
        return self.local.get(session_id)

    def merge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Merge into the local copy only (use :meth:`amerge` to share)."""
        self.local.merge(session_id, updates)

    async def aget(self, session_id: str) -> Mapping[str, Any]:
        """Read-only view of the session's memory from Redis; the local copy when Redis is down
        or does not hold the session."""
        raw = await self.link.run(lambda r: r.get(self._key(session_id)), _DOWN)
        if raw is _DOWN or raw is None:
            return self.local.get(session_id)
        try:
            mem = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("session value in redis is not JSON; using the local copy")
            return self.local.get(session_id)
        return MappingProxyType(mem if isinstance(mem, dict) else {})

    async def amerge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Shallow-update the session in Redis (atomically, TTL refreshed) and locally."""
        if not updates:
            return
        self.local.merge(session_id, updates)
        await self.link.run(lambda r: self._merge_tx(r, session_id, updates), None)

    async def _merge_tx(self, r: Any, session_id: str, updates: Mapping[str, Any]) -> None:
        import redis

        key = self._key(session_id)
        async with r.pipeline(transaction=True) as pipe:
            for _ in range(MAX_WATCH_RETRIES):
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    mem = orjson.loads(raw) if raw else {}
                    mem = {**(mem if isinstance(mem, dict) else {}), **updates}
                    mem, _, dropped = fit(mem, self.max_value_bytes, json_bytes)
                    if dropped:
                        log.warning("session value over %d bytes: dropped keys %s",
                                    self.max_value_bytes, ",".join(k[:40] for k in dropped))
                    pipe.multi()
                    pipe.set(key, orjson.dumps(mem, option=orjson.OPT_SORT_KEYS), ex=self.ttl_s)
                    await pipe.execute()
                    return
                except redis.WatchError:
                    continue
        log.warning("session merge kept locally only: %d conflicting writers", MAX_WATCH_RETRIES)

    async def delete(self, session_id: str) -> None:
        """Forget a session (Redis and local)."""
        await self.link.run(lambda r: r.delete(self._key(session_id)), None)
        self.local.forget(session_id)
