"""The block indexes' summaries shared by proxy replicas (issue 24; routing.kv_shared).

The Bloom summary by itself; then two replicas' hubs on the real Redis at 127.0.0.1:6379 (a
unique key prefix, deleted after), replica A following three real publishers, replica B not
subscribed: B routes on A's summaries, stops when A stops publishing (freshness as seen by B,
no clock of A's trusted), and with Redis down each replica is back to its own streams.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.cache.state.shared_state import RedisState
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import Policy
from prefixgate.proxy.routing.kv_events import KVEventHub
from prefixgate.proxy.routing.kv_shared import BlockSummary, SharedKVIndex
from tests.cache.test_redis_shared import SHARED, _shared_redis_or_skip
from tests.kv_events.helpers import Published

PROMPT = list(range(500, 524))  # 6 blocks of 4


def test_a_summary_holds_every_block_added_and_few_others() -> None:
    rng = random.Random(3)
    held = [rng.getrandbits(256) for _ in range(5000)]
    s = BlockSummary.of(held)
    assert all(h in s for h in held)
    absent = [rng.getrandbits(256) for _ in range(20_000)]
    false_pos = sum(h in s for h in absent) / len(absent)
    assert false_pos < 0.03
    back = BlockSummary.parse(s.text("w", 7))
    assert back is not None and back.filt == s.filt and back.blocks == 5000
    assert all(h in back for h in held[:100])
    for junk in ("", "a b c", "w 1 2 64 !!notbase64", "w 1 2 64 AAAA"):  # AAAA: 3 bytes, not 8
        assert BlockSummary.parse(junk) is None


def test_the_prefix_walk_stops_at_the_first_block_not_held() -> None:
    chain = [11, 22, 33, 44]
    s = BlockSummary.of([11, 22, 44])
    assert s.prefix_blocks(chain) == 2
    assert s.prefix_blocks([99, 11]) == 0


def test_a_summary_covers_the_newest_blocks_only() -> None:
    from prefixgate.proxy.routing import kv_shared

    hashes = list(range(1, kv_shared.SUMMARY_MAX_BLOCKS + 11))
    s = BlockSummary.of(hashes)
    assert s.blocks == kv_shared.SUMMARY_MAX_BLOCKS
    assert hashes[-1] in s


def _policy(pubs: list[Published], subscribe: bool, staleness: float = 5.0) -> Policy:
    deps = [{"name": f"d{i}", "base_url": f"http://10.0.0.{i + 1}:8000/v1",
             "kv_events": {"endpoint": p.pub_at, "replay": p.replay_at, "block_size": 4,
                           "subscribe": subscribe, "max_staleness_s": staleness}}
            for i, p in enumerate(pubs)]
    return parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": deps,
                                            "affinity": {"mode": "exact"}}},
                         "routes": [{"match": "*", "backend": "g"}]})


@pytest.fixture
def fleet() -> Any:
    pubs = [Published(), Published(), Published()]
    yield pubs
    for p in pubs:
        p.close()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    _shared_redis_or_skip()
    p = f"pgtest-{uuid.uuid4().hex[:8]}:"
    yield p
    import redis

    r = redis.Redis.from_url(SHARED)
    for k in r.scan_iter(match=p + "*"):
        r.delete(k)


async def test_an_unsubscribed_replica_routes_on_the_summary_another_shares(
        fleet: list[Published], prefix: str) -> None:
    staleness = 1.0  # generous: a loaded CI box may stall a few hundred ms between steps
    link_a, link_b = RedisLink(SHARED, prefix), RedisLink(SHARED, prefix)
    a = KVEventHub.from_policy(_policy(fleet, True, staleness))
    b = KVEventHub.from_policy(_policy(fleet, False, staleness))
    a.shared = SharedKVIndex(RedisState(link_a), a.streams, writer="a")
    b.shared = SharedKVIndex(RedisState(link_b), b.streams, writer="b")
    deps = _policy(fleet, False).backends["g"].group("g")
    try:
        for s in a.streams.values():
            assert await s.resync()
        fleet[1].insert(PROMPT)
        fleet[2].insert(PROMPT[:8])
        await asyncio.sleep(0.05)
        for s in a.streams.values():
            assert await s.replay_from(s.seq.last + 1)
        assert a.matches(deps, PROMPT) == [0, 24, 8]
        await b.refresh_shared(deps)
        assert b.matches(deps, PROMPT) is None  # nothing shared yet: B falls back
        assert await a.shared.publish_once() == 3
        await asyncio.sleep(0.06)  # past READ_MAX_AGE_S
        await b.refresh_shared(deps)
        assert b.matches(deps, PROMPT) == [0, 24, 8]
        # A stops publishing: B sees the same text for longer than max_staleness_s
        await asyncio.sleep(staleness + 0.2)
        await b.refresh_shared(deps)
        assert b.matches(deps, PROMPT) is None
        assert await a.shared.publish_once() == 0  # A's own streams are stale too: nothing
        for s in a.streams.values():  # A's liveness probes answer: its streams are fresh again
            assert await s.replay_from(s.seq.last + 1)
        assert await a.shared.publish_once() == 3  # a new text: fresh again for B
        await asyncio.sleep(0.06)
        await b.refresh_shared(deps)
        assert b.matches(deps, PROMPT) == [0, 24, 8]
    finally:
        await link_a.close()
        await link_b.close()


async def test_with_redis_down_each_replica_routes_on_its_own_streams(
        fleet: list[Published]) -> None:
    down = "redis://127.0.0.1:1/0"  # nothing listens: connection refused
    link_a, link_b = RedisLink(down, "x:"), RedisLink(down, "x:")
    a = KVEventHub.from_policy(_policy(fleet, True))
    b = KVEventHub.from_policy(_policy(fleet, False))
    a.shared = SharedKVIndex(RedisState(link_a), a.streams, writer="a")
    b.shared = SharedKVIndex(RedisState(link_b), b.streams, writer="b")
    deps = _policy(fleet, False).backends["g"].group("g")
    try:
        for s in a.streams.values():
            assert await s.resync()
        fleet[0].insert(PROMPT)
        await asyncio.sleep(0.05)
        for s in a.streams.values():
            assert await s.replay_from(s.seq.last + 1)
        assert await a.shared.publish_once() == 3  # into A's local state
        await b.refresh_shared(deps)
        assert b.matches(deps, PROMPT) is None  # B sees nothing of A's: per-replica
        assert a.matches(deps, PROMPT) == [24, 0, 0]  # A routes on its own streams
        assert (await b.shared.shared.read_many(["kvindex:d0"], []))[0] == [None]
    finally:
        await link_a.close()
        await link_b.close()



async def test_an_app_with_redis_publishes_its_streams_summaries(
        fleet: list[Published], prefix: str, tmp_path: Any) -> None:
    import redis

    from prefixgate.cache.ledger.store import Ledger
    from prefixgate.proxy.app import build_app

    deps = [{"name": f"d{i}", "base_url": f"http://10.0.0.{i + 1}:8000/v1",
             "kv_events": {"endpoint": p.pub_at, "replay": p.replay_at, "block_size": 4}}
            for i, p in enumerate(fleet)]
    policy = parse_policy({"backends": {"g": {"kind": "openai_compat", "deployments": deps,
                                              "affinity": {"mode": "exact"}}},
                           "routes": [{"match": "*", "backend": "g"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite"), "redis_url": SHARED,
                                      "redis_prefix": prefix}})
    app = build_app(policy, ledger=Ledger(str(tmp_path / "l.sqlite")), rewrite_fn=None,
                    analyze=False)
    r = redis.Redis.from_url(SHARED)
    async with app.router.lifespan_context(app):
        hub = app.state.proxy.kv_events
        assert hub.shared is not None
        fleet[0].insert(PROMPT)
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while loop.time() < end:
            raw = r.get(f"{prefix}state:kvindex:d0")
            got = BlockSummary.parse(raw.decode()) if raw else None
            if got is not None and got.blocks == 6:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no summary of d0's 6 blocks reached Redis")
        assert r.get(f"{prefix}state:kvindex:d1") is not None  # empty index: 0 blocks, published
