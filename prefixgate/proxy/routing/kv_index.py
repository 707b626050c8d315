"""One deployment's KV blocks as its own events say, and the order of those events (issue 24).

:class:`BlockIndex` is fed vLLM-schema events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``, :mod:`prefixgate.local_engine.kv.events` documents the fields) and answers
:meth:`BlockIndex.prefix_blocks`: how many leading blocks of a prompt the deployment holds. The
hashes are chained (each names its whole prefix), so the longest held prefix is the first miss
walking from block 0 — which is also how vLLM itself looks a prompt up (``find_longest_cache_hit``).
It is bounded: past ``max_blocks`` the oldest stored blocks are forgotten (a forgotten block
only costs a missed affinity, never a wrong one).

:class:`SeqTracker` reads the batch numbers: the next one is applied; an older or repeated one
is dropped; a jump is a **gap** (replay from ``last + 1``); a number below 2 after a higher
one is a **restart** (the publisher started over: full resync).
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from prefixgate.proxy.routing.kv_hash import normalize

Verdict = Literal["apply", "old", "gap", "restart"]


class BlockIndex:
    """The block hashes one deployment holds. ``max_blocks``: most remembered (oldest first
    forgotten). Counters: ``stored``, ``removed``, ``cleared``, ``bad`` (events not understood,
    skipped)."""

    def __init__(self, max_blocks: int = 1_000_000) -> None:
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.max_blocks = max_blocks
        self.stored = self.removed = self.cleared = self.bad = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def clear(self) -> None:
        """Forget every block (``AllBlocksCleared``, or before a full resync)."""
        self.blocks.clear()
        self.cleared += 1

    def apply(self, event: Any) -> None:
        """Apply one event (a list whose first item is its name, vLLM's tagged array form);
        anything unreadable counts in ``bad`` and changes nothing."""
        if not isinstance(event, list | tuple) or not event or not isinstance(event[0], str):
            self.bad += 1
            return
        name = event[0]
        if name == "AllBlocksCleared":
            self.clear()
        elif name == "BlockStored" and len(event) >= 2 and isinstance(event[1], list):
            for h in _hashes(event[1]):
                self.blocks[h] = None
                self.blocks.move_to_end(h)
                self.stored += 1
            while len(self.blocks) > self.max_blocks:
                self.blocks.popitem(last=False)
        elif name == "BlockRemoved" and len(event) >= 2 and isinstance(event[1], list):
            for h in _hashes(event[1]):
                if self.blocks.pop(h, 0) is None:
                    self.removed += 1
        else:
            self.bad += 1

    def apply_all(self, events: Iterable[Any]) -> None:
        """Apply a batch's events in order."""
        for e in events:
            self.apply(e)

    def apply_ops(self, ops: Iterable[tuple[str, array[int]]], slice_hashes: int) -> Iterator[int]:
        """Apply a batch read by :func:`prefixgate.proxy.routing.kv_batch.read_batch` (``stored``
        / ``removed`` hashes, ``cleared``), in order, with the same counters and bound as
        :meth:`apply`; a generator that yields (the hashes applied so far) after every
        ``slice_hashes`` hashes, so the caller can let its event loop run between slices."""
        blocks, done, mark = self.blocks, 0, slice_hashes
        for kind, hashes in ops:
            if kind == "cleared":
                self.clear()
                continue
            for start in range(0, len(hashes), slice_hashes):
                part = hashes[start:start + slice_hashes]
                if kind == "stored":
                    for h in part:
                        blocks[h] = None
                        blocks.move_to_end(h)
                    self.stored += len(part)
                    while len(blocks) > self.max_blocks:
                        blocks.popitem(last=False)
                else:
                    pop = blocks.pop
                    self.removed += sum(1 for h in part if pop(h, 0) is None)
                done += len(part)
                if done >= mark:
                    mark = done + slice_hashes
                    yield done

    def prefix_blocks(self, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` (a prompt's chained block hashes) held here."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n


def _hashes(raw: list[Any]) -> list[int]:
    return [h for h in (normalize(x) for x in raw) if h is not None]


class SeqTracker:
    """The last applied batch number (0: none yet) and what a new number means."""

    def __init__(self) -> None:
        self.last = 0

    def verdict(self, seq: int) -> Verdict:
        """``apply`` (``last + 1``, or anything first), ``old`` (<= ``last``), ``gap`` (beyond
        ``last + 1``), ``restart`` (1 after a higher number: the publisher started over)."""
        if self.last == 0 or seq == self.last + 1:
            return "apply"
        if seq <= 1 < self.last:
            return "restart"
        return "old" if seq <= self.last else "gap"
