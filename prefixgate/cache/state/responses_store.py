"""The response store: what ``previous_response_id`` and ``GET /v1/responses/{id}`` read.

A backend that speaks Chat Completions keeps no state, so for the responses prefixgate builds
for it (the bridge, :mod:`prefixgate.proxy.api.responses`) the store keeps the whole conversation: the
input items the backend saw (the chain's history included, oldest first) and the response
object with its output items. The next request naming ``previous_response_id`` is rebuilt as
``history + output + new input``: the same items in the same order every turn, so the prompt's
prefix stays stable and the backend's prefix cache keeps hitting. A response passed through to
an OpenAI backend is stored as a pointer (its backend name only): OpenAI keeps its own state.

``store: false`` on a request keeps it out of the store. :class:`MemoryResponseStore` is the
in-process LRU, bounded in entries, bytes **held** and age; :class:`ResponseStore` is the
interface a shared (Redis) store implements.

Memory (issue 20, Medium 9): a parsed response is ~7.6x its JSON in Python objects (dicts,
lists, str headers: 101 MiB of JSON held +767 MB RSS when the store kept the objects), so the
store keeps each response as its compact JSON bytes and parses on every read. What it counts
(:meth:`MemoryResponseStore.bytes`) is what it holds: the JSON bytes, the id, backend and tenant
strings, plus :data:`ENTRY_OVERHEAD` bytes per entry for the objects around them (CPython 3.11,
64-bit; the estimate is checked against ``tracemalloc`` by ``tests/proxy/test_responses_store.py``:
held <= 1.5x counted, for tiny and for 100 KB responses). The JSON is copied into a bytes object
of its exact size: orjson's own output object keeps its ~4 KB write buffer (a 100-byte response
held 4,089 bytes, measured).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

ENTRY_OVERHEAD = 360
"""Bytes counted per entry beyond its strings' and JSON's lengths: the ``bytes`` object header
(33), the entry tuple (96), its float and int (52), the id and tenant ``str`` headers (~100) and
the ordered dict's slot and link (~80); measured with ``tracemalloc`` (module docstring)."""

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]


@dataclass
class StoredResponse:
    """One stored response. ``response``: the response object (None for a passthrough
    pointer); ``input_items``: what the backend was given, history included; ``backend``: the
    policy backend that produced it; ``tenant``: whose it is (:mod:`prefixgate.proxy.http.tenants`, "" for
    none): only requests of the same tenant may read, continue or delete it."""

    id: str
    backend: str
    response: dict[str, Any] | None = None
    input_items: list[dict[str, Any]] = field(default_factory=list)
    tenant: str = ""

    def history(self) -> list[dict[str, Any]]:
        """The items a follow-up request starts with: input items, then this response's
        output items."""
        return self.input_items + list((self.response or {}).get("output") or [])


class ResponseStore(Protocol):
    """Where stored responses live (in-process here; Redis-backed later)."""

    def put(self, rec: StoredResponse) -> None:
        """Store ``rec`` (replacing one with the same id)."""
        ...

    def get(self, resp_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, expired, evicted or deleted)."""
        ...

    def delete(self, resp_id: str) -> bool:
        """Remove it; True when it was there."""
        ...


# one entry: (stored at, monotonic s; bytes counted; backend; tenant; JSON of [response, items])
_Entry = tuple[float, int, str, str, bytes]


class MemoryResponseStore:
    """In-process LRU of responses held as JSON bytes (module docstring), thread-safe.

    Bounds: ``max_entries`` responses, ``max_bytes`` bytes held (counted as in the module
    docstring; the least recently used go first), ``ttl_s`` seconds since stored (an older
    entry reads as absent). A single response larger than ``max_bytes`` is not stored.
    ``dumps`` / ``loads``: the JSON codec (default orjson; the proxy passes its exact-number
    one, :mod:`prefixgate.proxy.core.exactjson`, so a number reads back as the client wrote it).
    Every :meth:`get` parses anew: callers own what they get and may change it.
    """

    def __init__(self, max_entries: int = 10_000, max_bytes: int = 256 << 20,
                 ttl_s: float = 24 * 3600.0, dumps: Dumps = orjson.dumps,
                 loads: Loads = orjson.loads) -> None:
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self._dumps, self._loads = dumps, loads
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes held now, as counted (module docstring)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rec: StoredResponse) -> None:
        """See :class:`ResponseStore`. Serialises ``rec`` outside the lock."""
        blob = bytes(memoryview(self._dumps([rec.response, rec.input_items])))  # exact size
        size = len(blob) + len(rec.id) + len(rec.backend) + len(rec.tenant) + ENTRY_OVERHEAD
        with self._lock:
            self._drop(rec.id)
            if size > self.max_bytes:
                return
            self._items[rec.id] = (time.monotonic(), size, rec.backend, rec.tenant, blob)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def get(self, resp_id: str) -> StoredResponse | None:
        """See :class:`ResponseStore`; parsed from its JSON outside the lock."""
        with self._lock:
            hit = self._items.get(resp_id)
            if hit is None:
                return None
            if time.monotonic() - hit[0] > self.ttl_s:
                self._drop(resp_id)
                return None
            self._items.move_to_end(resp_id)
        _, _, backend, tenant, blob = hit
        response, items = self._loads(blob)
        return StoredResponse(resp_id, backend, response, items, tenant)

    def delete(self, resp_id: str) -> bool:
        """See :class:`ResponseStore`."""
        with self._lock:
            return self._drop(resp_id)

    def _drop(self, resp_id: str) -> bool:
        hit = self._items.pop(resp_id, None)
        if hit is None:
            return False
        self._bytes -= hit[1]
        return True
