"""The router's event stream against the engine's real publisher (loopback ZMQ): consumption,
gap replay, full resync, purge, restart, staleness."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from prefixgate.config.routing import Deployment, KVEventsSettings
from prefixgate.local_engine.kv.publisher import KVEventPublisher
from prefixgate.proxy.routing.kv_events import KVEventHub, KVEventStream
from prefixgate.proxy.routing.kv_hash import wire_hashes
from tests.kv_events.helpers import Published, until

A = list(range(100, 112))  # 3 blocks of 4
B = list(range(200, 208))  # 2 blocks


def _held(s: KVEventStream, toks: list[int]) -> int:
    k = s.settings
    return s.index.prefix_blocks(wire_hashes(toks, k.block_size, k.hash, k.hash_seed()))


@pytest.fixture
def published() -> object:
    p = Published()
    yield p
    p.close()


async def test_stream_follows_stores_and_evictions(published: Published) -> None:
    s = KVEventStream("d0", published.settings(), probe_s=0.2)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced)
        published.insert(A)
        await until(lambda: _held(s, A) == 3)
        assert _held(s, A[:8] + [0, 0, 0, 0]) == 2  # a prompt diverging in block 3
        published.tree.evict(100)
        await until(lambda: len(s.index) == 0)
        assert s.index.removed == 3 and s.gaps == 0
        assert s.lag_p99_ms() is not None and s.lag_p99_ms() < 2000  # type: ignore[operator]
    finally:
        task.cancel()


async def _live_frames(p: Published, n: int) -> list[tuple[int, bytes]]:
    """The next ``n`` PUB messages, read by our own SUB (so the test chooses what to drop)."""
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(p.pub_at)
    await asyncio.sleep(0.2)
    return sub  # type: ignore[return-value]


async def test_a_gap_is_filled_from_the_replay_socket(published: Published) -> None:
    s = KVEventStream("d0", published.settings())
    assert await s.resync()  # seq 1: the start-up AllBlocksCleared
    sub = await _live_frames(published, 0)
    try:
        published.insert(A)
        await asyncio.sleep(0.05)
        published.insert(B)
        frames = []
        for _ in range(2):
            assert await sub.poll(3000)  # type: ignore[attr-defined]
            frames.append(await sub.recv_multipart())  # type: ignore[attr-defined]
    finally:
        sub.close()  # type: ignore[attr-defined]
    seqs = [int.from_bytes(f[1], "big") for f in frames]
    assert seqs == [s.seq.last + 1, s.seq.last + 2]
    await s.handle(seqs[1], frames[1][2])  # the first one is lost on the way
    assert s.gaps == 1 and s.replays >= 2
    assert _held(s, A) == 3 and _held(s, B) == 2 and s.seq.last == seqs[1]


async def test_resync_rebuilds_from_a_snapshot_when_the_buffer_rolled() -> None:
    p = Published(buffer_steps=1)
    try:
        for i in range(4):
            p.insert([i * 10 + j for j in range(8)])
            await asyncio.sleep(0.03)
        s = KVEventStream("d0", p.settings())
        s.index.apply(["BlockStored", [12345], None, [1, 2, 3, 4], 4, None, "GPU"])  # stale state
        assert await s.resync()
        assert len(s.index) == 8 and 12345 not in s.index.blocks
        assert all(_held(s, [i * 10 + j for j in range(8)]) == 2 for i in range(4))
        assert s.seq.last == p.pub.seq  # numbered as the newest batch: live ones follow it
    finally:
        p.close()


async def test_all_blocks_cleared_purges_the_index(published: Published) -> None:
    s = KVEventStream("d0", published.settings(), probe_s=0.2)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced)
        published.insert(A)
        await until(lambda: _held(s, A) == 3)
        assert published.tree.reset() is not None
        await until(lambda: len(s.index) == 0)
        assert s.index.cleared >= 2  # the resync's and the engine's
    finally:
        task.cancel()


async def test_a_restarted_publisher_starts_the_index_over() -> None:
    p = Published()
    s = KVEventStream("d0", p.settings(), probe_s=0.1)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced)
        p.insert(A)
        p.insert(B)
        await until(lambda: _held(s, A) == 3 and s.seq.last >= 2)
        p.pub.close()
        p.rec.held.clear()  # the engine restarted: an empty cache, numbers from 1
        p.rec.pending = [["AllBlocksCleared"]]
        for _ in range(50):  # the closed sockets' ports are released by ZMQ's I/O thread
            p.pub = KVEventPublisher(p.rec, p.pub_at, p.replay_at, flush_ms=5)
            try:
                p.pub.start()
                break
            except zmq.ZMQError:
                await asyncio.sleep(0.05)
        await until(lambda: _held(s, A) == 0, timeout_s=8)
        p.insert(B)
        await until(lambda: _held(s, B) == 2, timeout_s=8)
        assert _held(s, A) == 0
    finally:
        task.cancel()
        p.close()


async def test_a_silent_publisher_goes_stale_within_the_bound() -> None:
    p = Published()
    s = KVEventStream("d0", p.settings(max_staleness_s=0.5), probe_s=0.1, replay_timeout_s=0.1)
    task = asyncio.create_task(s.run())
    try:
        await until(lambda: s.synced)
        p.insert(A)
        await until(lambda: _held(s, A) == 3)
        await asyncio.sleep(0.6)  # idle, but probes answer: still fresh
        assert s.usable()
        p.close()
        await until(lambda: not s.usable(), timeout_s=2)
        hub = KVEventHub({"d0": s})
        dep = Deployment(base_url="http://x/v1", name="d0")
        assert hub.matches([dep], A) is None  # stale: the caller falls back
    finally:
        task.cancel()


async def test_hub_matches_in_tokens_per_deployment(published: Published) -> None:
    s0 = KVEventStream("d0", published.settings())
    assert await s0.resync()
    published.insert(A)
    await asyncio.sleep(0.05)
    assert await s0.replay_from(s0.seq.last + 1)
    other = KVEventStream("d1", KVEventsSettings(endpoint="tcp://127.0.0.1:1"))
    hub = KVEventHub({"d0": s0, "d1": other})
    deps = [Deployment(base_url="http://a/v1", name="d1"), Deployment(base_url="http://b/v1", name="d0"),
            Deployment(base_url="http://c/v1", name="d2")]
    assert hub.matches(deps, A + [1, 2]) == [0, 12, 0]
    assert hub.covers(deps[:1]) and not hub.covers(deps[2:])
