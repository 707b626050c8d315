"""Session memory: small JSON-like state a rewrite pass keeps between a session's requests.

Passes read it through ``Context.session`` (a read-only view) and propose updates in
``Edit.memory``; the proxy calls :meth:`SessionStore.merge` after the request. Merging is a
shallow ``dict.update`` per session: a pass owns its own top-level keys.

Two stores: :class:`MemorySessionStore` (in-process LRU, the default) and
:class:`RedisSessionStore` (shared by several proxy processes; one JSON value per session under
``prefixgate:session:<id>``, expiring after ``ttl_s`` idle seconds).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol


class SessionStore(Protocol):
    """What the proxy needs from a session store."""

    def get(self, session_id: str) -> Mapping[str, Any]:
        """Read-only view of the session's memory (empty mapping for a new session)."""
        ...

    def merge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Shallow-update the session's memory with ``updates``."""
        ...


class MemorySessionStore:
    """In-process LRU of at most ``max_sessions`` sessions; thread-safe."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Mapping[str, Any]:
        """Read-only view (a copy: later merges do not show through it)."""
        with self._lock:
            mem = self._data.get(session_id)
            if mem is None:
                return MappingProxyType({})
            self._data.move_to_end(session_id)
            return MappingProxyType(dict(mem))

    def merge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Shallow-update; evicts the least recently used session beyond ``max_sessions``."""
        if not updates:
            return
        with self._lock:
            mem = self._data.setdefault(session_id, {})
            mem.update(updates)
            self._data.move_to_end(session_id)
            while len(self._data) > self.max_sessions:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class RedisSessionStore:
    """Sessions in Redis at ``url`` (e.g. ``redis://127.0.0.1:6379/0``) as JSON strings.

    ``merge`` is an optimistic transaction (WATCH/MULTI), so two proxies merging into one
    session do not lose each other's keys. Raises ``redis.RedisError`` when Redis is down.
    """

    def __init__(self, url: str, ttl_s: int = 24 * 3600, prefix: str = "prefixgate:session:"
                 ) -> None:
        import redis

        self._r = redis.Redis.from_url(url)
        self.ttl_s = ttl_s
        self.prefix = prefix

    def _key(self, session_id: str) -> str:
        return self.prefix + session_id

    def get(self, session_id: str) -> Mapping[str, Any]:
        """Read-only view of the stored JSON (empty for an unknown session)."""
        raw = self._r.get(self._key(session_id))
        return MappingProxyType(json.loads(raw) if raw else {})

    def merge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Shallow-update atomically and refresh the TTL."""
        if not updates:
            return
        import redis

        key = self._key(session_id)
        with self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    raw = pipe.get(key)
                    mem = json.loads(raw) if raw else {}
                    mem.update(updates)
                    pipe.multi()
                    pipe.set(key, json.dumps(mem, sort_keys=True), ex=self.ttl_s)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def delete(self, session_id: str) -> None:
        """Forget a session."""
        self._r.delete(self._key(session_id))
