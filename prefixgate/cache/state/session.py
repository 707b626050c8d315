"""Session memory: small JSON-like state a rewrite pass keeps between a session's requests.

Passes read it through ``Context.session`` (a read-only view) and propose updates in
``Edit.memory``; the proxy calls :meth:`SessionStore.merge` after the request. Merging is a
shallow ``dict.update`` per session: a pass owns its own top-level keys.

Two stores: :class:`MemorySessionStore` (in-process LRU, the default) and
:class:`prefixgate.cache.state.session_redis.SharedSessionStore` (shared by several proxy processes through
``redis.asyncio``, falling back to a local copy when Redis is down). The proxy awaits
``aget`` / ``amerge``, so a shared store never blocks the event loop.

Bounded in bytes (issue 8, class 2): a session's memory above its budget loses its largest keys
until it fits (:func:`fit`; logged by key name, never by content), and the in-process store
evicts least-recently-used sessions while the total passes :data:`DEFAULT_MAX_BYTES`. Sizes are
what the Python objects take (:func:`value_bytes`) in memory, the JSON length in Redis.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

log = logging.getLogger("prefixgate.sessions")

DEFAULT_MAX_BYTES = 40 << 20
"""All sessions of one in-process store together (40 MiB of object sizes; the process's
resident memory runs ~1.4x that, allocator overhead included, so <= 64 MB: issue 8's goal)."""
DEFAULT_MAX_SESSION_BYTES = 64 << 10
"""One session's memory (64 KiB): ~10x what the passes keep for a session (hoist_volatile's
packed digests are at most ~4 KB), so only a runaway value is ever dropped."""
ENTRY_OVERHEAD_BYTES = 200
"""Per-session bookkeeping outside the memory dict (LRU node, size entry)."""


def value_bytes(v: Any) -> int:
    """Bytes a JSON-like value takes as Python objects (``sys.getsizeof``, recursively; shared
    objects counted each time, so an upper bound). Linear in the value's size."""
    size = sys.getsizeof(v)
    if isinstance(v, dict):
        return size + sum(value_bytes(k) + value_bytes(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return size + sum(value_bytes(x) for x in v)
    return size


def json_bytes(v: Any) -> int:
    """Length of the value's compact JSON (how Redis stores it)."""
    return len(json.dumps(v, separators=(",", ":")))


def fit(mem: dict[str, Any], budget: int, size: Callable[[Any], int] = value_bytes
        ) -> tuple[dict[str, Any], int, list[str]]:
    """``(mem, its size, dropped keys)``: ``mem`` without its largest keys until the sum of the
    per-key sizes fits ``budget`` bytes."""
    sizes = {k: size(k) + size(v) for k, v in mem.items()}
    total = sum(sizes.values())
    dropped: list[str] = []
    for k in sorted(sizes, key=lambda k: -sizes[k]):
        if total <= budget:
            break
        total -= sizes[k]
        dropped.append(k)
    if dropped:
        mem = {k: v for k, v in mem.items() if k not in dropped}
    return mem, total, dropped


class SessionStore(Protocol):
    """What the proxy needs from a session store."""

    def get(self, session_id: str) -> Mapping[str, Any]:
        """Read-only view of the session's memory (empty mapping for a new session)."""
        ...

    def merge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """Shallow-update the session's memory with ``updates``."""
        ...

    async def aget(self, session_id: str) -> Mapping[str, Any]:
        """:meth:`get` for the event loop (a shared store does its I/O here)."""
        ...

    async def amerge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """:meth:`merge` for the event loop."""
        ...


class MemorySessionStore:
    """In-process LRU of sessions, bounded in count and bytes; thread-safe.

    ``max_sessions``: at most this many sessions; ``max_bytes``: their memory together (sizes
    by :func:`value_bytes` plus :data:`ENTRY_OVERHEAD_BYTES` each); ``max_session_bytes``: one
    session's memory (its largest keys are dropped to fit). The least recently used session
    goes first. ``bytes_used`` is kept exact by every merge and eviction.
    """

    def __init__(self, max_sessions: int = 10_000, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.max_session_bytes = max_session_bytes
        self.bytes_used = 0
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._sizes: dict[str, int] = {}
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
        """Shallow-update; fit the session to its budget; evict LRU sessions past the limits."""
        if not updates:
            return
        with self._lock:  # one critical section: concurrent merges never lose a key
            mem = {**self._data.get(session_id, {}), **updates}
            mem, size, dropped = fit(mem, self.max_session_bytes)
            size += ENTRY_OVERHEAD_BYTES + len(session_id)
            self.bytes_used += size - self._sizes.get(session_id, 0)
            self._data[session_id] = mem
            self._sizes[session_id] = size
            self._data.move_to_end(session_id)
            while len(self._data) > self.max_sessions or (
                    self.bytes_used > self.max_bytes and len(self._data) > 1):
                old, _ = self._data.popitem(last=False)
                self.bytes_used -= self._sizes.pop(old)
        if dropped:
            log.warning("session memory over %d bytes: dropped keys %s", self.max_session_bytes,
                        ",".join(k[:40] for k in dropped))

    async def aget(self, session_id: str) -> Mapping[str, Any]:
        """:meth:`get` (no I/O: nothing to await)."""
        return self.get(session_id)

    async def amerge(self, session_id: str, updates: Mapping[str, Any]) -> None:
        """:meth:`merge` (no I/O: nothing to await)."""
        self.merge(session_id, updates)

    def forget(self, session_id: str) -> None:
        """Drop a session (no-op when unknown)."""
        with self._lock:
            if self._data.pop(session_id, None) is not None:
                self.bytes_used -= self._sizes.pop(session_id)

    def __len__(self) -> int:
        return len(self._data)
