"""The KV block indexes' summaries shared by proxy replicas through Redis (issue 24).

Every replica that follows a deployment's KV events (:mod:`prefixgate.proxy.routing.kv_events`)
publishes a **summary** of that deployment's block index to the shared state
(:mod:`prefixgate.cache.state.shared_state`), name ``kvindex:<deployment>``; a replica whose own
stream of that deployment is not usable — not subscribed (``kv_events.subscribe: false``: the
engines' ZMQ ports are not reachable from it, or N proxies x M engines subscriptions are too
many), still syncing after a start, or cut off — routes on the freshest summary instead.

**Summary.** A Bloom filter of the newest :data:`SUMMARY_MAX_BLOCKS` block hashes of the index,
:data:`BITS_PER_BLOCK` bits per block and :data:`PROBES` probes (false positives ~1.5 %; a false
positive can only lengthen a match by one block past a real miss, never invent a prefix: the
walk from block 0 stops at the first miss, as :meth:`BlockIndex.prefix_blocks` does). Text form
``"<writer> <n> <blocks> <bits> <base64 filter>"``; ``n`` counts the writer's publications, so
the text changes on every one (every ``publish_s``, while the stream is usable).

**Freshness, clocks.** No writer's clock is trusted (as for the load tables,
:mod:`prefixgate.proxy.routing.shared`): a summary counts while its text changed, as seen here,
within the deployment's ``kv_events.max_staleness_s``; a writer that stops (its stream stale, the
replica gone) stops changing it, and its summary stops counting within that bound; the name
itself expires after twice that.

**Redis down.** :class:`~prefixgate.cache.state.shared_state.RedisState` answers from this replica's
local state: each replica reads back only its own summaries, i.e. routes on its own streams —
per-replica, as the breakers and load guard degrade. Cost: one round trip (MGET) per routing
decision that needs a summary (none while every stream of the group is usable here), reused
for :data:`READ_MAX_AGE_S`; one write per deployment per ``publish_s``, the filter built off the
event loop.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import anyio

from prefixgate.cache.state.shared_state import SharedState

log = logging.getLogger("prefixgate.kv_events")

SUMMARY_MAX_BLOCKS = 65_536
"""Newest blocks of an index a summary covers (older ones: a missed affinity at worst)."""
BITS_PER_BLOCK = 12
PROBES = 4
READ_MAX_AGE_S = 0.05
"""A summaries read is reused this long (s): a burst of routing decisions makes one round trip."""
_MASK = (1 << 64) - 1


def _mix(h: int) -> int:
    """splitmix64 of a block hash's low 64 bits (vLLM's hashes are sha256 already; ours too —
    the mix keeps the probes independent whatever the hash form)."""
    z = (h + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _probes(h: int, bits: int) -> list[int]:
    z = _mix(h & _MASK)
    a, b = z & 0xFFFFFFFF, (z >> 32) | 1
    return [(a + i * b) % bits for i in range(PROBES)]


class BlockSummary:
    """A Bloom filter over block hashes (module docstring). ``bits``: the filter's size in bits
    (>= 8); ``blocks``: how many hashes were added."""

    def __init__(self, bits: int, filt: bytearray | None = None, blocks: int = 0) -> None:
        if bits < 8:
            raise ValueError("a block summary has at least 8 bits")
        self.bits, self.blocks = bits, blocks
        self.filt = filt if filt is not None else bytearray((bits + 7) // 8)
        if len(self.filt) != (bits + 7) // 8:
            raise ValueError("filter length does not match its bit count")

    @classmethod
    def of(cls, hashes: Sequence[int]) -> BlockSummary:
        """The summary of ``hashes`` (the newest :data:`SUMMARY_MAX_BLOCKS` of them: the last)."""
        kept = hashes[-SUMMARY_MAX_BLOCKS:]
        s = cls(max(64, BITS_PER_BLOCK * len(kept)))
        for h in kept:
            s.add(h)
        return s

    def add(self, h: int) -> None:
        """Add one block hash."""
        for p in _probes(h, self.bits):
            self.filt[p >> 3] |= 1 << (p & 7)
        self.blocks += 1

    def __contains__(self, h: int) -> bool:
        return all(self.filt[p >> 3] >> (p & 7) & 1 for p in _probes(h, self.bits))

    def prefix_blocks(self, hashes: Iterable[int]) -> int:
        """Leading blocks of ``hashes`` (a prompt's chained block hashes) the summary holds."""
        n = 0
        for h in hashes:
            if h not in self:
                break
            n += 1
        return n

    def text(self, writer: str, n: int) -> str:
        """The shared text form (module docstring)."""
        return f"{writer} {n} {self.blocks} {self.bits} {base64.b64encode(self.filt).decode()}"

    @classmethod
    def parse(cls, text: str) -> BlockSummary | None:
        """A summary from its text form; None when it is not one."""
        parts = text.split(" ")
        if len(parts) != 5:
            return None
        try:
            blocks, bits = int(parts[2]), int(parts[3])
            filt = bytearray(base64.b64decode(parts[4], validate=True))
            return cls(bits, filt, blocks)
        except ValueError:  # binascii.Error is a ValueError
            return None


class Followed(Protocol):
    """What a summary needs of a stream (:class:`~prefixgate.proxy.routing.kv_events.KVEventStream`)."""

    batches: int
    index: Any  # .blocks: the held hashes, oldest first
    settings: Any  # .max_staleness_s

    def usable(self) -> bool:
        """Synced and fresh."""
        ...


class SharedKVIndex:
    """Publishes this replica's usable streams' summaries and reads the others' (module
    docstring). ``streams``: the hub's, by deployment name; ``clock``: monotonic seconds."""

    def __init__(self, shared: SharedState, streams: Mapping[str, Followed], *,
                 writer: str | None = None, publish_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.shared, self.streams = shared, streams
        self.writer = writer or uuid.uuid4().hex[:12]
        self.publish_s, self.clock = publish_s, clock
        self._n = 0
        self._published: dict[str, int] = {}  # deployment -> stream batches at the last publish
        self._seen: dict[str, tuple[str, float]] = {}  # deployment -> (text, first seen here)
        self._parsed: dict[str, BlockSummary | None] = {}  # read: deployment -> summary
        self._own: dict[str, BlockSummary] = {}  # written: deployment -> this replica's summary
        self._read_at: dict[tuple[str, ...], float] = {}
        self.publishes = self.reads = self.read_failures = 0

    def _staleness(self, name: str) -> float:
        s = self.streams.get(name)
        return float(s.settings.max_staleness_s) if s is not None else 5.0

    # ---- writing ---------------------------------------------------------------------------

    async def publish_once(self) -> int:
        """Write the summary of every usable stream here; returns how many were written. The
        filter is rebuilt only when the stream applied a batch since the last build."""
        self._n += 1
        written = 0
        for name, s in self.streams.items():
            if not s.usable():
                continue
            batches = s.batches
            hashes = list(s.index.blocks)  # a snapshot, taken on the loop
            if self._published.get(name) != batches or name not in self._own:
                self._own[name] = await anyio.to_thread.run_sync(BlockSummary.of, hashes)
                self._published[name] = batches
            own = self._own[name]
            ttl = 2 * self._staleness(name)
            await self.shared.put(f"kvindex:{name}", own.text(self.writer, self._n), ttl)
            written += 1
        self.publishes += written
        return written

    async def run(self) -> None:
        """Publish every ``publish_s`` until cancelled; a failed write is logged, not raised."""
        while True:
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - sharing must never stop the proxy
                log.exception("KV index summary publish failed")
            await asyncio.sleep(self.publish_s)

    # ---- reading ---------------------------------------------------------------------------

    async def refresh(self, names: Sequence[str]) -> None:
        """Read the summaries of ``names`` (one round trip, reused for :data:`READ_MAX_AGE_S`)."""
        key = tuple(names)
        now = self.clock()
        if now - self._read_at.get(key, float("-inf")) < READ_MAX_AGE_S:
            return
        self._read_at[key] = now
        try:
            vals, _ = await self.shared.read_many([f"kvindex:{n}" for n in names], [])
        except Exception:  # noqa: BLE001 - RedisState falls back itself; anything else: none
            self.read_failures += 1
            return
        self.reads += 1
        for n, v in zip(names, vals, strict=True):
            if v is None:
                self._seen.pop(n, None)
                self._parsed.pop(n, None)
                continue
            old = self._seen.get(n)
            if old is None or old[0] != v:
                self._seen[n] = (v, now)
                self._parsed[n] = BlockSummary.parse(v)

    def summary(self, name: str) -> BlockSummary | None:
        """The fresh summary of deployment ``name`` (module docstring), else None."""
        seen = self._seen.get(name)
        if seen is None or self.clock() - seen[1] > self._staleness(name):
            return None
        return self._parsed.get(name)
