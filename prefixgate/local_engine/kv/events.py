"""KV cache events in vLLM's schema, recorded from the radix tree (issue 24, item 1).

The tree holds token runs; a router wants *blocks*: ``block_size`` tokens each, named by chained
hashes it can recompute from a prompt's ids (:mod:`prefixgate.local_engine.kv.block_hash`). The
:class:`KVEventRecorder` turns the tree's changes into vLLM's three events
(vllm/distributed/kv_events.py, ``msgspec`` structs with ``array_like=True, tag=True``, so each
is a list whose first item is its name):

- ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``:
  full blocks that entered the tree (``token_ids``: theirs, concatenated; ``parent_block_hash``:
  the hash before the first of them, None at a sequence's start; ``lora_id`` None; ``medium``
  ``"GPU"`` as vLLM names its device tier, whatever our device is);
- ``["BlockRemoved", block_hashes, medium]``: blocks that left it (an evicted leaf takes every
  block that reaches into it: blocks ``start // B`` .. ``end // B - 1`` of its path, where
  ``start`` is its parent's depth);
- ``["AllBlocksCleared"]``: the tree was emptied (reset, or the engine just started).

Rule: a block is announced stored once while held, removed once when it goes; ``held`` is the
exact set of full blocks the tree holds (``check`` in tests compares it with the tree). The
recorder is called on the engine thread and read by the publisher thread: one lock guards
``held`` and ``pending``.
"""

from __future__ import annotations

import threading
from typing import Any

from prefixgate.local_engine.kv.block_hash import block_digests, wire_hash

MEDIUM = "GPU"
Event = list[Any]


class KVEventRecorder:
    """Blocks held by the tree and the events not yet published.

    ``block_size``: tokens per block (>= 1); ``algo`` / ``seed``: the block hash
    (:func:`~prefixgate.local_engine.kv.block_hash.block_digests`); ``page_size``: the tree's
    page (only whole pages enter it). ValueError on a bad size or hash name.
    """

    def __init__(self, block_size: int = 16, algo: str = "sha256", seed: str = "",
                 page_size: int = 1) -> None:
        if block_size < 1 or page_size < 1:
            raise ValueError("block_size and page_size must be >= 1")
        block_digests([], block_size, algo, seed)  # validates the hash name
        self.block_size, self.algo, self.seed, self.page_size = block_size, algo, seed, page_size
        self.lock = threading.Lock()
        # wire hash -> (parent wire hash, the block's tokens); insertion order: parents first
        self.held: dict[int, tuple[int | None, list[int]]] = {}
        self.pending: list[Event] = [["AllBlocksCleared"]]

    def _hashes(self, tokens: list[int], extra_key: bytes | None) -> list[int]:
        return [wire_hash(d) for d in block_digests(tokens, self.block_size, self.algo,
                                                      self.seed, extra_key)]

    def stored(self, extra_key: bytes | None, tokens: list[int]) -> None:
        """``tokens`` (a path from the root) are in the tree: announce its full blocks not yet
        held, one ``BlockStored`` per run of consecutive new blocks."""
        tokens = tokens[:len(tokens) - len(tokens) % self.page_size]
        hashes = self._hashes(tokens, extra_key)
        B = self.block_size
        with self.lock:
            new = [i for i, h in enumerate(hashes) if h not in self.held]
            for i in new:
                self.held[hashes[i]] = (hashes[i - 1] if i else None, tokens[i * B:(i + 1) * B])
            for a, b in _runs(new):
                self.pending.append(["BlockStored", hashes[a:b], hashes[a - 1] if a else None,
                                     tokens[a * B:b * B], B, None, MEDIUM])

    def on_insert(self, extra_key: bytes | None, _request_id: str, tokens: list[int]) -> None:
        """:attr:`KVManager.on_insert` listener (the tree took ``tokens``)."""
        self.stored(extra_key, tokens)

    def evicted(self, extra_key: bytes | None, path: list[int], start: int) -> None:
        """A leaf left the tree: ``path`` is its tokens from the root, ``start`` its parent's
        depth; every held block reaching past ``start`` is announced removed."""
        hashes = self._hashes(path, extra_key)
        with self.lock:
            gone = [h for h in hashes[start // self.block_size:] if self.held.pop(h, None)]
            if gone:
                self.pending.append(["BlockRemoved", gone, MEDIUM])

    def cleared(self) -> None:
        """The tree was emptied: ``AllBlocksCleared``, nothing held."""
        with self.lock:
            self.held.clear()
            self.pending.append(["AllBlocksCleared"])

    def take(self) -> list[Event]:
        """The events recorded since the last take (caller holds :attr:`lock`)."""
        out, self.pending = self.pending, []
        return out

    def snapshot(self) -> list[Event]:
        """The held blocks as events (caller holds :attr:`lock`): ``AllBlocksCleared`` then one
        ``BlockStored`` per block, parents first — what a consumer needs to rebuild the
        index from nothing (a full resync, as Dynamo's tree dump)."""
        out: list[Event] = [["AllBlocksCleared"]]
        for h, (parent, toks) in self.held.items():
            out.append(["BlockStored", [h], parent, toks, self.block_size, None, MEDIUM])
        return out


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of consecutive ints in the sorted ``indices``."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out
