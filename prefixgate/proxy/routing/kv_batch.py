"""A KV-event batch read in small steps, so that a huge one never holds the event loop (issue 34
item 10).

An ``EventBatch`` payload is msgpack ``[ts, events, dp_rank?]`` with vLLM's tagged-array events
(``["BlockStored", block_hashes, parent, token_ids, block_size, lora_id, medium]``,
``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``;
:mod:`prefixgate.local_engine.kv.events` documents the fields). One ``msgpack.unpackb`` of a
10 MB batch (2 M hashes) is a single C call that builds millions of objects while holding the
GIL, and applying them one by one took the proxy's loop 2.15 s; the engine's own resync snapshot
is such a batch on a large pool, at every (re)connect.

:func:`read_batch` walks the payload with a streaming :class:`msgpack.Unpacker`, one event — and
inside an event one hash — at a time (no single long C call), keeping only what the index uses:
per run of same-kind events one compact ``array('Q')`` of normalized hashes (no object per hash,
nothing for the cycle collector to walk). Large payloads (:data:`OFF_LOOP_BYTES` and up) are
read in a worker thread of their own (never the default executor); the caller applies the result
with :meth:`prefixgate.proxy.routing.kv_index.BlockIndex.apply_ops`, which yields every
:data:`SLICE_HASHES` hashes so the loop serves requests between slices.

Same verdicts as a whole decode: a payload that is not a batch (not msgpack, trailing bytes, no
``[number, [events...]]``) is None and nothing of it is applied; an event that is not understood
(not a list, no name, an unknown name, hashes not a list) counts in ``bad`` and is skipped.
"""

from __future__ import annotations

import asyncio
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgpack

from prefixgate.proxy.routing.kv_hash import normalize

OFF_LOOP_BYTES = 64 << 10
"""Payloads from this size are read in the KV-event thread, smaller ones at once on the loop."""
SLICE_HASHES = 4096
"""Hashes applied between two turns of the event loop (~5 ms of work)."""
STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
_KIND = {"BlockStored": STORED, "BlockRemoved": REMOVED}


@dataclass
class Batch:
    """One batch: ``ts`` (epoch seconds, the publisher's), ``ops`` (``(kind, hashes)`` in event
    order, consecutive events of one kind merged; ``cleared`` ops hold no hashes), ``bad``
    (events not understood), ``first_cleared`` (its first event is ``AllBlocksCleared``: it alone
    is the full state)."""

    ts: float
    ops: list[tuple[str, array[int]]] = field(default_factory=list)
    bad: int = 0
    first_cleared: bool = False

    def hashes(self) -> int:
        """Hashes in all ops."""
        return sum(len(h) for _, h in self.ops)


def _skip(u: msgpack.Unpacker, n: int) -> None:
    for _ in range(n):
        u.skip()


def _read_event(u: msgpack.Unpacker, batch: Batch, first: bool) -> None:
    """Read one event into ``batch`` (module docstring's rules)."""
    try:
        n = u.read_array_header()
    except ValueError:  # not a list (the unpacker has not moved): skip it whole
        u.skip()
        batch.bad += 1
        return
    if n == 0:
        batch.bad += 1
        return
    name = u.unpack()
    kind = _KIND.get(name) if isinstance(name, str) else None
    if name == "AllBlocksCleared":
        _skip(u, n - 1)
        batch.ops.append((CLEARED, array("Q")))
        batch.first_cleared = batch.first_cleared or first
        return
    if kind is None or n < 2:
        _skip(u, n - 1)
        batch.bad += 1
        return
    try:
        m = u.read_array_header()
    except ValueError:  # hashes not a list
        _skip(u, n - 1)
        batch.bad += 1
        return
    if batch.ops and batch.ops[-1][0] == kind:
        hashes = batch.ops[-1][1]
    else:
        hashes = array("Q")
        batch.ops.append((kind, hashes))
    unpack, append = u.unpack, hashes.append
    for _ in range(m):
        h = normalize(unpack())
        if h is not None:
            append(h)
    _skip(u, n - 2)


def read_batch(payload: bytes) -> Batch | None:
    """The batch in ``payload``, or None when it is not one (module docstring)."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(1, len(payload)))
    try:
        u.feed(payload)
        n = u.read_array_header()
        if n < 2:
            return None
        ts = u.unpack()
        if not isinstance(ts, int | float):
            return None
        batch = Batch(float(ts))
        for i in range(u.read_array_header()):
            _read_event(u, batch, i == 0)
        _skip(u, n - 2)  # dp_rank
        if u.tell() != len(payload):
            return None  # trailing bytes: not one batch
    except (ValueError, msgpack.UnpackException):
        return None
    return batch


_POOL: ThreadPoolExecutor | None = None


async def read_batch_off_loop(payload: bytes) -> Batch | None:
    """:func:`read_batch`, in the KV-event thread for a payload of :data:`OFF_LOOP_BYTES` or
    more (one thread for every stream: batches are read one at a time, never on the default
    executor that tokenizing and the rewrites use)."""
    global _POOL
    if len(payload) < OFF_LOOP_BYTES:
        return read_batch(payload)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-events")
    return await asyncio.get_running_loop().run_in_executor(_POOL, read_batch, payload)
