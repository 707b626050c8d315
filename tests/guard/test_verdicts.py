"""The guard's verdicts (prefixgate/cache/guard/verdicts.py) per (route, tenant, move), in
process and shared by two replicas through real Redis: decided at the test's looks, held until
they expire, later pairs ignored, tenants apart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from prefixgate.cache.guard.sequential import TestRule
from prefixgate.cache.guard.verdicts import GuardBook, MoveVerdict, pack, unpack
from prefixgate.cache.state.shared_state import LocalState, RedisState
from tests.guard.conftest import Clock, Yielding

RULE = TestRule()
TTL = 3600.0


async def add(book: GuardBook, n: int, move_changed: bool = False, floor_changed: bool = False,
              route: str = "r", tenant: str = "t", move: str = "hoist_volatile") -> MoveVerdict:
    v = None
    for _ in range(n):
        v = await book.add_pair(route, tenant, move, move_changed, floor_changed)
    assert v is not None
    return v


def test_the_packed_counter_holds_four_counts() -> None:
    total = sum(pack(m, f) for m, f in [(True, False), (True, True), (False, True), (False, False)] * 50)
    c = unpack(total)
    assert (c.pairs, c.move_changed, c.floor_changed, c.both_changed) == (200, 100, 100, 50)


def test_headers_read_as_the_interface_says() -> None:
    assert MoveVerdict("m", "trialling", 12, 0.1, 0.0, 0, 0, "").header() == "trialling (12 pairs)"
    assert MoveVerdict("m", "on", 40, 0, 0, 1, 2, "").header() == "on (40 pairs, 0.00 vs floor 0.00)"
    assert MoveVerdict("m", "off", 20, 0.85, 0, 1, 2, "").header() == "off (20 pairs, 0.85 vs floor 0.00)"


async def test_an_unaffected_move_is_turned_on_and_later_pairs_are_ignored(local: LocalState,
                                                                         clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    assert (await add(book, 59)).header() == "trialling (59 pairs)"
    v = await add(book, 1)
    assert v.state == "on" and v.pairs == 60 and v.expires_at == clock.now + TTL
    later = await add(book, 30, move_changed=True)  # ignored while the verdict holds
    assert later == v
    got = await book.verdicts("r", "t", ["hoist_volatile", "prune_tools"])
    assert got["hoist_volatile"] == v and got["prune_tools"].header() == "trialling (0 pairs)"


async def test_an_affected_move_is_off_at_the_first_look(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    v = await add(book, 20, move_changed=True)
    assert v.header() == "off (20 pairs, 1.00 vs floor 0.00)" and "worse than the floor" in v.reason


async def test_a_verdict_expires_and_the_move_is_trialled_afresh(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    await add(book, 20, move_changed=True)
    clock.now += TTL - 1
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].state == "off"
    clock.now += 1
    fresh = (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"]
    assert fresh.header() == "trialling (0 pairs)"
    assert (await add(book, 1)).pairs == 1  # the counts restarted
    assert (await add(book, 59)).state == "on"  # the backend changed: now unaffected


async def test_an_expired_verdict_still_in_shared_state_reads_as_trialling(clock: Clock) -> None:
    shared = LocalState(clock=lambda: 0.0)  # never expires anything itself
    book = GuardBook(shared, RULE, TTL, clock=clock)
    await add(book, 20, move_changed=True)
    clock.now += TTL
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].header() == "trialling (0 pairs)"
    assert (await add(book, 1)).header() == "trialling (1 pairs)"


async def test_tenants_and_routes_never_share_verdicts(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    await add(book, 20, move_changed=True, route="r:x", tenant="t")
    for route, tenant in [("r:x", "u"), ("r", "x:t"), ("r", "t"), ("r:x:t", "")]:
        got = await book.verdicts(route, tenant, ["hoist_volatile"])
        assert got["hoist_volatile"].header() == "trialling (0 pairs)", (route, tenant)
    assert (await add(book, 1, route="r", tenant="x:t")).pairs == 1


async def test_the_snapshot_lists_what_this_process_saw(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    await add(book, 20, move_changed=True, tenant="b")
    await book.verdicts("r", "a", ["prune_rag"])
    snap = book.snapshot()
    assert [(s["tenant"], s["move"], s["state"], s["pairs"]) for s in snap] == [
        ("a", "prune_rag", "trialling", 0), ("b", "hoist_volatile", "off", 20)]
    assert set(snap[1]) == {"route", "tenant", "move", "state", "pairs", "move_rate", "floor_rate",
                            "reason", "expires_at"}


def test_bad_settings_are_refused(local: LocalState) -> None:
    with pytest.raises(ValueError):
        GuardBook(local, RULE, 0)
    with pytest.raises(ValueError):
        GuardBook(local, TestRule(max_pairs=40_000), TTL)


async def test_two_replicas_share_one_trial_through_redis(redis_states: Sequence[RedisState],
                                                          clock: Clock) -> None:
    a, b = (GuardBook(s, RULE, TTL, clock=clock) for s in redis_states)
    await add(a, 30)
    assert (await b.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].pairs == 30
    v = await add(b, 30)
    assert v.state == "on" and v.pairs == 60
    assert (await a.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"] == v
    assert await add(a, 5, move_changed=True) == v  # ignored on the other replica too
    other = await a.verdicts("r", "t2", ["hoist_volatile"])
    assert other["hoist_volatile"].header() == "trialling (0 pairs)"  # another tenant
    clock.now += TTL
    assert (await b.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].header() == "trialling (0 pairs)"
    assert (await add(a, 20, move_changed=True)).state == "off"
    assert [s.link.outages for s in redis_states] == [0, 0]  # shared in Redis, not locally


async def test_pairs_racing_past_the_last_look_never_decide_twice(local: LocalState, clock: Clock) -> None:
    book = GuardBook(Yielding(local), RULE, TTL, clock=clock)
    await local.incr("guard:c:r:t:hoist_volatile:packed", 199 * pack(False, False))
    got = await asyncio.gather(*(book.add_pair("r", "t", "hoist_volatile", False, False) for _ in range(3)))
    assert sorted(v.state for v in got) == ["on", "trialling", "trialling"]
    assert all("being decided" in v.reason for v in got if v.state == "trialling")
    assert await local.count("guard:c:r:t:hoist_volatile:packed") == 2 * pack(False, False)
