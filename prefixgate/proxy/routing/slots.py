"""Pin each conversation to one llama.cpp slot (issue 24, item 3).

llama.cpp's server keeps one KV cache per slot (``--parallel N``) and, unless told which slot a
request takes (``id_slot`` in the body, llama.cpp ``tools/server/README.md``), gives it the
idle slot whose cached prompt is most similar — or the least recently used one. Measured on
tau-bench turns interleaved across 3 conversations: every request reused only the shared system
prompt another conversation left, never its own history (issue 24); ``bench/kv_routing.py``
found the same with llama.cpp's host-memory prompt cache off (``--cache-ram 0``; it came with
llama.cpp PR 16391, Oct 2025, default 8 GiB: it saves a slot's prompt when the slot is reused and
restores it when its conversation returns, which does what pinning does). So for a ``llamacpp``
backend the proxy names the slot: the conversation's key (the session id) is pinned to one slot
of the deployment that serves it, and every later turn goes back to it.

Balance: a new key takes the slot of that deployment with the fewest live keys; ties go to the
slot used least recently (its cache is the least likely to be wanted again). A key is live while
seen within ``ttl_s``; at most :data:`MAX_KEYS` keys are kept (least recently seen forgotten
first). :func:`with_id_slot` writes the slot into the upstream bytes, leaving every other byte
as it was; a client's own ``id_slot`` is replaced by the proxy's.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from prefixgate.proxy.core import exactjson

MAX_KEYS = 100_000


class SlotTable:
    """Which slot of which deployment each conversation key holds. ``now``: monotonic seconds."""

    def __init__(self, ttl_s: float = 600.0, now: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.now = ttl_s, now
        self._keys: collections.OrderedDict[tuple[str, str], tuple[int, float]] = (
            collections.OrderedDict())
        self._live: collections.Counter[tuple[str, int]] = collections.Counter()
        self._used: dict[tuple[str, int], float] = {}

    def slot_for(self, deployment: str, key: str, slots: int) -> int:
        """The slot (0 .. ``slots``-1) of ``deployment`` that ``key``'s requests take (module
        docstring). ValueError when ``slots`` < 1."""
        if slots < 1:
            raise ValueError("a llama.cpp deployment has at least one slot")
        now = self.now()
        self._forget(now - self.ttl_s)
        held = self._keys.pop((deployment, key), None)
        if held is not None and held[0] < slots:
            slot = held[0]
        else:
            if held is not None:
                self._live[(deployment, held[0])] -= 1
            slot = min(range(slots), key=lambda s: (self._live[(deployment, s)],
                                                    self._used.get((deployment, s), -1.0), s))
            self._live[(deployment, slot)] += 1
        self._keys[(deployment, key)] = (slot, now)
        self._used[(deployment, slot)] = now
        if len(self._keys) > MAX_KEYS:
            (dep, _), (old, _) = self._keys.popitem(last=False)
            self._live[(dep, old)] -= 1
        return slot

    def live(self, deployment: str, slot: int) -> int:
        """Keys pinned to ``slot`` of ``deployment`` now."""
        return self._live[(deployment, slot)]

    def _forget(self, before: float) -> None:
        while self._keys:
            (dep, _), (slot, seen) = next(iter(self._keys.items()))
            if seen >= before:
                return
            self._keys.popitem(last=False)
            self._live[(dep, slot)] -= 1


def with_id_slot(body: bytes, slot: int) -> bytes:
    """``body`` (a JSON object's bytes) with ``"id_slot": slot`` first; unchanged when it is
    not a JSON object. A client's own ``id_slot`` is replaced (issue 34, item 11: the proxy
    drives the slots, so a tenant names neither another's slot nor a value llama.cpp would take
    as sent); the body is then re-encoded with its numbers' text kept
    (:mod:`prefixgate.proxy.core.exactjson`), otherwise spliced byte for byte."""
    try:
        doc = exactjson.loads(body)
    except ValueError:
        return body
    if not isinstance(doc, dict):
        return body
    if "id_slot" in doc:
        doc.pop("id_slot")
        return exactjson.dumps({"id_slot": int(slot), **doc})
    start = body.index(b"{") + 1
    sep = b"" if not doc else b","
    return body[:start] + b'"id_slot":' + str(int(slot)).encode() + sep + body[start:]
