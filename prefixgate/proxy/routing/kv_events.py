"""Consume the deployments' KV events: one :class:`KVEventStream` per deployment (issue 24).

A stream subscribes (ZMQ SUB) to the deployment's ``kv_events.endpoint`` and keeps its
:class:`~prefixgate.proxy.routing.kv_index.BlockIndex` in step with what the engine holds:

- **in order**: batch ``last + 1`` is applied; older ones dropped;
- **gap** (a number skipped): the missing batches are asked of the replay socket (vLLM's
  protocol: ``start_seq`` -> frames ``[seq, payload]`` ... ``[-1, b""]``; asked from a DEALER
  with REQ's empty delimiter frame, since a REQ socket keeps only the first reply) and applied
  first; a batch that starts with ``AllBlocksCleared`` needs no replay (nothing before it counts);
- **full resync** at every (re)connect, on a publisher restart (its numbers start over), and
  when a replay cannot fill a gap: the index is emptied and replayed from 0 (our engine answers
  0 with a snapshot of every held block; vLLM with what its buffer keeps);
- **skip** a batch whose payload cannot be read (counted in ``undecodable``): its number is
  taken as passed, live or replayed, so one bad batch in a publisher's replay buffer is not a
  hole every resync meets again (issue 34, item 14: the index stayed unusable);
- **purge** on ``AllBlocksCleared`` (llm-d ignores it; a cleared engine routed for its old
  blocks would get every such request cold).

**A free event loop** (issue 34 item 10): a batch is read by
:func:`~prefixgate.proxy.routing.kv_batch.read_batch` (in its own thread from 64 KiB on) and
applied in slices of :data:`~prefixgate.proxy.routing.kv_batch.SLICE_HASHES` hashes with the loop
turning between them: a 10 MB batch (2 M hashes) had held the loop 2.15 s.

**Staleness, bounded and measured.** After ``probe_s`` without an event the stream asks the
replay socket for ``last + 1`` (a probe: it answers at once, with any missed batch); the stream
is *fresh* while its last event or answered probe is under ``kv_events.max_staleness_s`` old,
and :meth:`KVEventHub.matches` uses only fresh, synced indexes — a dead or unreachable
publisher falls back to the approximate placement within that bound. ``lags_ms`` samples each
batch's delay, receive time minus the batch's ``ts`` (same clock when on one host).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from prefixgate.config.routing import Deployment, KVEventsSettings
from prefixgate.config.schema import Policy
from prefixgate.proxy.routing.kv_batch import SLICE_HASHES, Batch, read_batch_off_loop
from prefixgate.proxy.routing.kv_hash import wire_hashes
from prefixgate.proxy.routing.kv_index import BlockIndex, SeqTracker
from prefixgate.proxy.routing.kv_shared import SharedKVIndex

log = logging.getLogger("prefixgate.kv_events")

END_SEQ = -1


class KVEventStream:
    """One deployment's event stream and block index (module docstring). ``clock``:
    monotonic seconds; ``wall``: epoch seconds (the batches' ``ts``); ``replay_timeout_s``:
    bound on one replay exchange; ``probe_s``: silence before a liveness probe."""

    def __init__(self, name: str, settings: KVEventsSettings,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 replay_timeout_s: float = 1.0, probe_s: float = 1.0) -> None:
        self.name, self.settings = name, settings
        self.clock, self.wall = clock, wall
        self.replay_timeout_s, self.probe_s = replay_timeout_s, probe_s
        self.index = BlockIndex()
        self.seq = SeqTracker()
        self.synced = False
        self.seen_at = float("-inf")
        self.lags_ms: collections.deque[float] = collections.deque(maxlen=10_000)
        self.gaps = self.replays = self.resyncs = self.batches = 0
        self.undecodable = 0  # batches whose payload could not be read: skipped, never a hole
        self._ctx = zmq.asyncio.Context.instance()

    # -- state ---------------------------------------------------------------------------------
    def staleness_s(self) -> float:
        """Seconds since the stream was last seen alive (an event or an answered probe)."""
        return self.clock() - self.seen_at

    def usable(self) -> bool:
        """Synced and fresh (module docstring)."""
        return self.synced and self.staleness_s() <= self.settings.max_staleness_s

    def lag_p99_ms(self) -> float | None:
        """99th percentile of the sampled event delays (ms), None before any."""
        if not self.lags_ms:
            return None
        xs = sorted(self.lags_ms)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))]

    # -- applying ------------------------------------------------------------------------------
    async def _apply(self, seq: int, batch: Batch, live: bool) -> None:
        """Apply ``batch`` in slices, the loop turning between them (module docstring)."""
        for _ in self.index.apply_ops(batch.ops, SLICE_HASHES):
            await asyncio.sleep(0)
        self.index.bad += batch.bad
        self.seq.last = seq
        self.batches += 1
        self.seen_at = self.clock()
        if live:
            self.lags_ms.append(max(0.0, (self.wall() - batch.ts) * 1e3))

    async def handle(self, seq: int, payload: bytes) -> None:
        """One live PUB message (module docstring's rules)."""
        batch = await read_batch_off_loop(payload)
        if batch is None:  # skipped (counted): its number is taken, so no gap follows it
            self.index.bad += 1
            self.undecodable += 1
            if self.seq.last and self.seq.verdict(seq) == "apply":
                self.seq.last = seq
            return
        verdict = self.seq.verdict(seq)
        if verdict == "old":
            self.seen_at = self.clock()
            return
        if verdict == "restart" or (verdict == "gap" and batch.first_cleared):
            if verdict == "restart":
                self.resyncs += 1
            self.index.clear()
            await self._apply(seq, batch, live=True)
            return
        if verdict == "gap":
            self.gaps += 1
            ok = await self.replay_from(self.seq.last + 1)
            if self.seq.last >= seq:
                return  # the replay brought this batch too
            if not ok or self.seq.last + 1 < seq:
                await self.resync()
                if self.seq.last >= seq:
                    return
        await self._apply(seq, batch, live=True)

    async def resync(self) -> bool:
        """Empty the index and rebuild it from the replay socket (from 0); True when the replay
        answered. Without a replay socket the index starts empty and fills from live events."""
        self.resyncs += 1
        self.index.clear()
        self.seq.last = 0
        if self.settings.replay is None:
            self.synced = True
            self.seen_at = self.clock()
            return True
        self.synced = await self.replay_from(0)
        return self.synced

    async def replay_from(self, start: int) -> bool:
        """Ask the replay socket for batches from ``start`` and apply the ones that follow
        ``last`` (a batch starting with ``AllBlocksCleared`` replaces the index whatever its
        number; an unreadable batch is skipped, its number passed). False when there is no
        replay socket, it did not answer within ``replay_timeout_s``, or a hole remains."""
        if self.settings.replay is None:
            return False
        self.replays += 1
        sock = self._ctx.socket(zmq.DEALER)  # a REQ would take one reply frame, not many
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.settings.replay)
        whole = True
        skipped: set[int] = set()
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            while True:
                if not await sock.poll(self.replay_timeout_s * 1e3):
                    return False
                frames = await sock.recv_multipart()
                if frames and not frames[0]:
                    frames = frames[1:]  # the REQ-style empty delimiter
                if len(frames) < 2:
                    return False
                seq = int.from_bytes(frames[0], "big", signed=True)
                if seq == END_SEQ or not frames[1]:
                    break
                batch = await read_batch_off_loop(frames[1])
                if batch is None:  # issue 34, item 14: skipped and counted, not a hole
                    self.undecodable += 1
                    skipped.add(seq)
                    continue
                if batch.first_cleared:
                    self.index.clear()
                    await self._apply(seq, batch, live=False)
                elif seq == self.seq.last + 1 or self.seq.last == 0 and start == 0 or (
                        seq > self.seq.last + 1 and seq - self.seq.last - 1 <= len(skipped)
                        and all(n in skipped for n in range(self.seq.last + 1, seq))):
                    await self._apply(seq, batch, live=False)
                elif seq > self.seq.last + 1:
                    whole = False
            while self.seq.last and self.seq.last + 1 in skipped:  # trailing unreadable ones
                self.seq.last += 1
            self.seen_at = self.clock()
            return whole
        finally:
            sock.close()

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe and follow the stream forever (reconnecting, with a full resync, after any
        error); cancel to stop."""
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV events of %s: stream failed; resyncing", self.name)
            self.synced = False
            await asyncio.sleep(self.probe_s)

    async def _session(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        sub.connect(self.settings.endpoint)
        try:
            await asyncio.sleep(0.05)  # let the SUB join, so nothing falls between it and the resync
            await self.resync()
            while True:
                if await sub.poll(self.probe_s * 1e3):
                    frames = await sub.recv_multipart()
                    if len(frames) >= 3:
                        await self.handle(int.from_bytes(frames[1], "big", signed=True), frames[2])
                    continue
                if not self.synced:
                    await self.resync()
                elif self.settings.replay is not None and not await self.replay_from(
                        self.seq.last + 1):
                    self.synced = False
        finally:
            sub.close()


class KVEventHub:
    """Every deployment's stream, by deployment name; :meth:`start` / :meth:`stop` their tasks.
    ``shared``: the index summaries shared with the other proxy replicas (None: this replica's
    streams only), :mod:`prefixgate.proxy.routing.kv_shared`."""

    def __init__(self, streams: dict[str, KVEventStream] | None = None,
                 shared: SharedKVIndex | None = None) -> None:
        self.streams: dict[str, KVEventStream] = streams or {}
        self.shared = shared
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def from_policy(cls, policy: Policy, **kw: Any) -> KVEventHub:
        """A stream for every deployment of the policy with ``kv_events`` (``kw``: stream options)."""
        streams = {d.name: KVEventStream(d.name, d.kv_events, **kw)
                   for name, b in policy.backends.items() for d in b.group(name)
                   if d.kv_events is not None}
        return cls(streams)

    def start(self) -> None:
        """Start a task per subscribed stream, and the summaries' publisher (on the running
        loop)."""
        self._tasks = [asyncio.create_task(s.run(), name=f"kv-events:{n}")
                       for n, s in self.streams.items() if s.settings.subscribe]
        if self.shared is not None:
            self._tasks.append(asyncio.create_task(self.shared.run(), name="kv-index-summaries"))

    async def stop(self) -> None:
        """Cancel the tasks and wait for them."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._tasks = []

    def covers(self, deps: list[Deployment]) -> bool:
        """Whether any of ``deps`` publishes events."""
        return any(d.name in self.streams for d in deps)

    async def refresh_shared(self, deps: list[Deployment]) -> None:
        """Read the shared summaries of those of ``deps`` whose stream is not usable here (no
        I/O when every one is, or nothing is shared)."""
        if self.shared is None:
            return
        names = [d.name for d in deps if d.name in self.streams
                 and not self.streams[d.name].usable()]
        if names:
            await self.shared.refresh(names)

    def matches(self, deps: list[Deployment], tokens: list[int],
                salt: bytes | None = None) -> list[int] | None:
        """Cached tokens of the prompt ``tokens`` on each of ``deps`` by their indexes (whole
        blocks: held prefix blocks x block size) — this replica's own stream where usable, else
        the fresh shared summary (:meth:`refresh_shared` first); 0 for a deployment with
        neither — or None when no deployment has either (the caller falls back)."""
        out, hashes, any_usable = [], {}, False
        for d in deps:
            s = self.streams.get(d.name)
            summary = None
            if s is not None and not s.usable() and self.shared is not None:
                summary = self.shared.summary(d.name)
            if s is None or (not s.usable() and summary is None):
                out.append(0)
                continue
            any_usable = True
            k = s.settings
            key = (k.block_size, k.hash, k.hash_seed())
            if key not in hashes:
                hashes[key] = wire_hashes(tokens, k.block_size, k.hash, k.hash_seed(), salt)
            held = summary if summary is not None else s.index
            out.append(held.prefix_blocks(hashes[key]) * k.block_size)
        return out if any_usable else None
