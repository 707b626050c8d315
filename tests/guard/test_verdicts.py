"""The guard's verdicts (prefixgate/cache/guard/verdicts.py) per (route, tenant, move), in
process and shared by two replicas through real Redis: decided at the test's looks, held until
they expire, later pairs ignored, tenants apart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from prefixgate.cache.guard.sequential import PairCounts, TestRule
from prefixgate.cache.guard.verdicts import DAMAGED, SNAPSHOT_CAP, GuardBook, MoveVerdict, pack, unpack
from prefixgate.cache.state.shared_state import LocalState, RedisState, SharedState
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
    assert (await add(book, 1)).header() == "trialling (1 pair)"


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


# --- packed counts, settings at their edges -------------------------------------------------

FIELD = (1 << 16) - 1  # one packed count's largest value


@given(both=st.integers(0, FIELD), move_only=st.integers(0, FIELD), floor_only=st.integers(0, FIELD),
       neither=st.integers(0, FIELD))
def test_counts_up_to_the_field_limit_unpack_exactly(both: int, move_only: int, floor_only: int,
                                                     neither: int) -> None:
    pairs = both + move_only + floor_only + neither
    assume(pairs <= FIELD)
    total = (both * pack(True, True) + move_only * pack(True, False) + floor_only * pack(False, True)
             + neither * pack(False, False))
    assert unpack(total) == PairCounts(pairs, both + move_only, both + floor_only, both)


@pytest.mark.parametrize("ttl", [0, -0.5, -TTL])
def test_a_ttl_not_above_zero_is_refused(local: LocalState, ttl: float) -> None:
    with pytest.raises(ValueError, match=f"^ttl_s must be > 0, got {ttl}$"):
        GuardBook(local, RULE, ttl)


@pytest.mark.parametrize("max_pairs", [32_767, 32_768, 65_535])
def test_max_pairs_from_half_a_field_on_is_refused(local: LocalState, max_pairs: int) -> None:
    with pytest.raises(ValueError, match=r"^max_pairs must be below 32767 \(packed counters\)$"):
        GuardBook(local, TestRule(max_pairs=max_pairs), TTL)


async def test_a_ttl_below_a_second_holds_its_verdict_that_long(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, 0.5, clock=clock)
    v = await add(book, 20, move_changed=True)
    assert v.state == "off" and v.expires_at == clock.now + 0.5
    clock.now += 0.25
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"] == v
    clock.now += 0.25
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].state == "trialling"


@pytest.mark.parametrize(("move_only", "both", "state"), [
    (0, 32_765, "on"), (0, 0, "on"), (16_000, 16_765, "off"), (32_765, 0, "off")])
async def test_the_largest_max_pairs_decides_on_counts_near_half_a_field(
        local: LocalState, clock: Clock, move_only: int, both: int, state: str) -> None:
    """max_pairs = 32766, the largest allowed: its last look's counts unpack whole (no field
    spills into the next) and the counter is taken back to zero."""
    rule = TestRule(max_pairs=32_766, look_every=16_383)
    book = GuardBook(local, rule, TTL, clock=clock)
    ckey = "guard:c:r:t:hoist_volatile:packed"
    await local.incr(ckey, move_only * pack(True, False) + both * pack(True, True)
                     + (32_765 - move_only - both) * pack(False, False))
    v = await book.add_pair("r", "t", "hoist_volatile", True, False)
    assert (v.state, v.pairs, v.move_rate, v.floor_rate) == (
        state, 32_766, (move_only + both + 1) / 32_766, both / 32_766)
    assert v.expires_at == clock.now + TTL and await local.count(ckey) == 0


# --- expiry: the verdict, the trial's counter, in SharedState and on the book's clock ----------

async def test_a_verdict_holds_until_just_before_expires_at_and_leaves_shared_state_then(
        local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    decided = clock.now
    v = await add(book, 20, move_changed=True)
    assert (v.decided_at, v.expires_at) == (decided, decided + TTL)
    assert json.loads(await local.get("guard:v:r:t:hoist_volatile") or "")["decided_at"] == decided
    clock.now = decided + TTL - 1e-3
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"] == v
    assert await add(book, 1) == v  # still ignored
    clock.now = decided + TTL
    assert await local.get("guard:v:r:t:hoist_volatile") is None  # SharedState forgot it too
    assert (await add(book, 1)).header() == "trialling (1 pair)"


async def test_an_abandoned_trial_is_forgotten_ttl_after_its_last_pair(local: LocalState,
                                                                      clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    await add(book, 10, move_changed=True)
    clock.now += TTL - 1
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].pairs == 10
    await add(book, 1)  # the expiry slides from this pair on
    clock.now += TTL - 1
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].pairs == 11
    clock.now += 1
    assert (await book.verdicts("r", "t", ["hoist_volatile"]))["hoist_volatile"].pairs == 0


class Slow:
    """A SharedState whose operations named in ``slow`` return ``delay`` seconds (of ``clock``)
    after they took effect."""

    def __init__(self, inner: LocalState, clock: Clock, delay: float, slow: set[str]) -> None:
        self.inner, self.clock, self.delay, self.slow = inner, clock, delay, slow

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.inner, name)
        if name not in self.slow:
            return op

        async def call(*args: Any, **kw: Any) -> Any:
            out = await op(*args, **kw)
            self.clock.now += self.delay
            return out
        return call


async def test_a_reset_meeting_an_expired_counter_leaves_nothing_past_ttl(local: LocalState,
                                                                         clock: Clock) -> None:
    """The verdict's write outlasts the counter (a write slower than ttl_s): the reset lands on
    an expired counter; what it leaves still expires ttl_s later, and the next trial starts at
    zero."""
    book = GuardBook(Slow(local, clock, TTL, {"put"}), RULE, TTL, clock=clock)  # type: ignore[arg-type]
    await add(book, 19, move_changed=True)
    assert (await add(book, 1, move_changed=True)).state == "off"
    clock.now += TTL
    assert (await add(book, 1)).header() == "trialling (1 pair)"


async def test_redis_keeps_the_verdict_and_the_counter_for_ttl(redis_states: Sequence[RedisState],
                                                              clock: Clock) -> None:
    a = GuardBook(redis_states[0], RULE, TTL, clock=clock)
    client, link = redis_states[0].link.client, redis_states[0].link
    await add(a, 5, move="m1")
    await add(a, 20, move_changed=True, move="m2")
    for name in ["guard:c:r:t:m1:packed", "guard:v:r:t:m2", "guard:c:r:t:m2:packed"]:
        assert 0 < await client.pttl(link.key("state", name)) <= TTL * 1000, name
    assert await redis_states[1].count("guard:c:r:t:m2:packed") == 0


# --- what is read: several moves, stored records, keys named as documented ---------------------

async def each_move_reads_its_own_verdict_or_counts(state: SharedState, clock: Clock) -> None:
    """Five moves read in one round trip: one decided, four trialling with distinct counts."""
    book = GuardBook(state, RULE, TTL, clock=clock)
    await add(book, 3, move="a", move_changed=True)
    await add(book, 7, move="b", floor_changed=True)
    off = await add(book, 20, move="c", move_changed=True)
    await add(book, 1, move="e", move_changed=True, floor_changed=True)
    got = await book.verdicts("r", "t", ["a", "b", "c", "d", "e"])
    assert got["c"] == off
    want = {"a": (3, 1.0, 0.0), "b": (7, 0.0, 1.0), "d": (0, 0.0, 0.0), "e": (1, 1.0, 1.0)}
    for move, (pairs, move_rate, floor_rate) in want.items():
        assert got[move] == MoveVerdict(move, "trialling", pairs, move_rate, floor_rate, 0.0, 0.0,
                                        f"{pairs} pairs; next look at 20"), move


async def test_one_local_read_gives_each_move_its_own(local: LocalState, clock: Clock) -> None:
    await each_move_reads_its_own_verdict_or_counts(local, clock)


async def test_one_redis_read_gives_each_move_its_own(redis_states: Sequence[RedisState],
                                                      clock: Clock) -> None:
    await each_move_reads_its_own_verdict_or_counts(redis_states[0], clock)


async def test_a_trialling_pair_returns_its_rates_and_no_times(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    for m, f in [(True, False), (True, True), (False, True), (False, False), (True, False)]:
        v = await book.add_pair("r", "t", "x", m, f)
    assert v == MoveVerdict("x", "trialling", 5, 3 / 5, 2 / 5, 0.0, 0.0, "5 pairs; next look at 20")
    clock.now += 10
    assert (await book.verdicts("r", "t", ["x"]))["x"] == v


async def test_a_stored_record_reading_trialling_is_never_held(local: LocalState, clock: Clock) -> None:
    """Only a decided verdict holds: a record that says "trialling" (however long it claims to
    last) leaves the move to its trial's counts, and pairs are counted."""
    book = GuardBook(local, RULE, TTL, clock=clock)
    record = MoveVerdict("x", "trialling", 99, 0.5, 0.5, clock.now, clock.now + TTL, "")
    await local.put("guard:v:r:t:x", json.dumps(asdict(record)))
    await local.incr("guard:c:r:t:x:packed", 4 * pack(False, False))
    assert (await book.verdicts("r", "t", ["x"]))["x"].header() == "trialling (4 pairs)"
    assert (await book.add_pair("r", "t", "x", False, False)).header() == "trialling (5 pairs)"


@pytest.mark.parametrize(("route", "tenant", "move", "quoted"), [
    ("r/x", "t", "m", "r%2Fx:t:m"), ("r", "a/b", "m", "r:a%2Fb:m"), ("r", "t", "m/n", "r:t:m%2Fn"),
    ("a:b%", "c/d:", "e%f/", "a%3Ab%25:c%2Fd%3A:e%25f%2F")])
async def test_keys_are_named_as_documented_every_part_fully_quoted(
        local: LocalState, clock: Clock, route: str, tenant: str, move: str, quoted: str) -> None:
    """``guard:c:<route>:<tenant>:<move>:packed`` / ``guard:v:...`` with ':' '%' and '/' all
    percent-quoted: replicas of any version name a trial alike."""
    book = GuardBook(local, RULE, TTL, clock=clock)
    await local.incr(f"guard:c:{quoted}:packed", 19 * pack(True, False))
    assert (await book.verdicts(route, tenant, [move]))[move].header() == "trialling (19 pairs)"
    v = await book.add_pair(route, tenant, move, True, False)
    assert v.state == "off" and json.loads(await local.get(f"guard:v:{quoted}") or "")["pairs"] == 20
    assert await local.count(f"guard:c:{quoted}:packed") == 0


# --- racing past the last look, and what the snapshot remembers ---------------------------------

async def test_pairs_past_the_last_look_read_as_trialling_with_their_counts(local: LocalState,
                                                                           clock: Clock) -> None:
    book = GuardBook(Yielding(local), RULE, TTL, clock=clock)  # type: ignore[arg-type]
    seed = (3 * pack(True, True) + 7 * pack(True, False) + 5 * pack(False, True)
            + 184 * pack(False, False))  # 199 pairs: 10 moved, 8 floor
    await local.incr("guard:c:r:t:hoist_volatile:packed", seed)
    got = await asyncio.gather(*(book.add_pair("r", "t", "hoist_volatile", False, False) for _ in range(3)))
    decided = [v for v in got if v.state != "trialling"]
    assert len(decided) == 1 and decided[0].pairs == 200
    past = sorted((v for v in got if v.state == "trialling"), key=lambda v: v.pairs)
    assert past == [MoveVerdict("hoist_volatile", "trialling", n, 10 / n, 8 / n, 0.0, 0.0,
                                "past 200 pairs: the last look is being decided") for n in (201, 202)]
    assert [(s["route"], s["tenant"], s["move"]) for s in book.snapshot()] == [("r", "t", "hoist_volatile")]


@pytest.mark.parametrize(("route", "tenant"), [("r", "t"), ("r:1/a", "t%2F")])
async def test_a_replica_ignoring_a_pair_notes_the_held_verdict_under_its_route_and_tenant(
        local: LocalState, clock: Clock, route: str, tenant: str) -> None:
    a, b = GuardBook(local, RULE, TTL, clock=clock), GuardBook(local, RULE, TTL, clock=clock)
    v = await add(a, 20, move_changed=True, route=route, tenant=tenant)
    assert await add(b, 1, route=route, tenant=tenant) == v  # b never read it before
    snap = b.snapshot()
    assert [(s["route"], s["tenant"], s["move"], s["state"]) for s in snap] == [
        (route, tenant, "hoist_volatile", "off")]
    assert snap[0]["expires_at"] == v.expires_at


async def test_the_snapshot_keeps_the_latest_cap_verdicts_seen(local: LocalState, clock: Clock) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    moves = [f"m{i:05d}" for i in range(SNAPSHOT_CAP)]
    await book.verdicts("r", "t", moves)
    assert [s["move"] for s in book.snapshot()] == moves  # exactly the cap: none dropped
    await book.verdicts("r", "t", [moves[0]])  # seen again: now the latest
    await book.verdicts("r", "t", ["new"])
    kept = [s["move"] for s in book.snapshot()]
    assert len(kept) == SNAPSHOT_CAP and "new" in kept and moves[0] in kept and moves[1] not in kept
    await add(book, 2, move="x", route="q")
    kept = {(s["route"], s["move"]) for s in book.snapshot()}
    assert len(kept) == SNAPSHOT_CAP and ("q", "x") in kept and ("r", moves[2]) not in kept


# --- a reset that met another counter ------------------------------------------------------------




class Outage:
    """A RedisState whose outage the test switches: while ``down`` every operation is answered
    by its local state (as RedisState does while Redis is down); ``back_after_put``: Redis comes
    back as soon as a verdict has been written (so the trial's reset reaches Redis)."""

    def __init__(self, inner: RedisState) -> None:
        self.inner, self.down, self.back_after_put = inner, False, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner.local if self.down else self.inner, name)

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        await (self.inner.local if self.down else self.inner).put(name, value, ttl_s)
        if self.back_after_put:
            self.down = False


@pytest.mark.parametrize(("unchanged", "floor"), [(10, 0), (25, 5), (0, 19)])
async def test_a_trial_decided_during_an_outage_leaves_redis_counting_afresh(
        redis_states: Sequence[RedisState], clock: Clock, unchanged: int, floor: int) -> None:
    """Redis holds other replicas' pairs; this replica counts 20 pairs alone during an outage,
    decides, and its reset reaches Redis once it is back: Redis's counter reads impossible
    counts. Readers read no pairs; the next pair takes the counter back to zero (and is lost);
    the trial then counts from one."""
    a = Outage(redis_states[0])
    b = GuardBook(redis_states[1], RULE, TTL, clock=clock)
    await redis_states[1].incr("guard:c:r:t:m:packed", unchanged * pack(False, False) + floor * pack(False, True))
    book = GuardBook(a, RULE, TTL, clock=clock)  # type: ignore[arg-type]
    a.down = True
    await add(book, 19, move_changed=True, move="m")
    a.back_after_put = True
    assert (await add(book, 1, move_changed=True, move="m")).state == "off"
    assert not a.down and await redis_states[1].count("guard:c:r:t:m:packed") != 0
    assert (await b.verdicts("r", "t", ["m"]))["m"].header() == "trialling (0 pairs)"
    assert await b.add_pair("r", "t", "m", True, False) == MoveVerdict(
        "m", "trialling", 0, 0.0, 0.0, 0.0, 0.0, DAMAGED)
    assert await redis_states[1].count("guard:c:r:t:m:packed") == 0
    assert (await add(b, 1, move_changed=True, move="m")).header() == "trialling (1 pair)"


@pytest.mark.parametrize("left", [
    -2, -pack(True, False), -pack(False, True), -pack(True, True), -20 * pack(False, False),
    -(1 << 16), -(1 << 48), 2 << 16, 2 << 32, 1 << 48, (1 << 16) + (1 << 32),
    (RULE.max_pairs + RULE.look_every + 1) * pack(False, False)])
async def test_a_counter_left_impossible_reads_as_no_pairs_and_is_taken_back(
        local: LocalState, clock: Clock, left: int) -> None:
    """What no trial can hold (below zero, more changed answers than pairs, more than a look's
    pairs past the last look), one pair on: the next pair takes it back to zero; readers read no
    pairs."""
    book = GuardBook(local, RULE, TTL, clock=clock)
    await local.incr("guard:c:r:t:m:packed", left)
    assert (await book.verdicts("r", "t", ["m"]))["m"].header() == "trialling (0 pairs)"
    assert (await book.add_pair("r", "t", "m", False, False)).reason == DAMAGED
    assert await local.count("guard:c:r:t:m:packed") == 0
    assert (await add(book, 1, move="m")).header() == "trialling (1 pair)"
    assert [(s["route"], s["tenant"], s["move"]) for s in book.snapshot()] == [("r", "t", "m")]


async def test_a_pair_bringing_a_counter_below_zero_back_to_zero_counts_on_from_there(
        local: LocalState, clock: Clock) -> None:
    """At -1 (a reset one unchanged pair short) the counter is read as no pairs; the pair that
    brings it to zero leaves it there, and the trial counts on from the next."""
    book = GuardBook(local, RULE, TTL, clock=clock)
    await local.incr("guard:c:r:t:m:packed", -1)
    assert (await book.verdicts("r", "t", ["m"]))["m"].header() == "trialling (0 pairs)"
    v = await book.add_pair("r", "t", "m", False, False)
    assert (v.pairs, v.reason) == (0, "0 pairs; next look at 20")
    assert (await add(book, 2, move="m")).header() == "trialling (2 pairs)"


async def test_what_a_take_back_leaves_on_an_expired_counter_expires_ttl_later(
        local: LocalState, clock: Clock) -> None:
    """Increments that return ttl_s after they counted: the take-back lands on an expired
    counter; what it leaves expires ttl_s later, so a pair then starts the trial at one."""
    await local.incr("guard:c:r:t:m:packed", -20)
    book = GuardBook(Slow(local, clock, TTL, {"incr"}), RULE, TTL, clock=clock)  # type: ignore[arg-type]
    assert (await book.add_pair("r", "t", "m", False, False)).reason == DAMAGED
    assert (await book.add_pair("r", "t", "m", False, False)).header() == "trialling (1 pair)"


@pytest.mark.parametrize("left", [
    0, pack(False, False), pack(True, False), pack(False, True), pack(True, True),
    3 * pack(True, True) + 2 * pack(True, False) + pack(False, True) + 4 * pack(False, False),
    (RULE.max_pairs + RULE.look_every - 1) * pack(False, False)])
async def test_a_counter_any_trial_can_hold_is_counted_on(local: LocalState, clock: Clock,
                                                          left: int) -> None:
    book = GuardBook(local, RULE, TTL, clock=clock)
    await local.incr("guard:c:r:t:m:packed", left)
    c = unpack(left)
    assert (await book.verdicts("r", "t", ["m"]))["m"].pairs == c.pairs
    v = await book.add_pair("r", "t", "m", False, False)
    assert (v.pairs, v.move_rate) == (c.pairs + 1, c.move_changed / (c.pairs + 1))
    assert await local.count("guard:c:r:t:m:packed") == left + 1
    assert (await book.verdicts("r", "t", ["m"]))["m"].pairs == c.pairs + 1


async def test_a_pair_after_a_reset_met_an_expired_counter_restarts_the_trial(local: LocalState,
                                                                            clock: Clock) -> None:
    book = GuardBook(Slow(local, clock, TTL, {"put"}), RULE, TTL, clock=clock)  # type: ignore[arg-type]
    await add(book, 20, move_changed=True)
    assert (await add(book, 1)).reason == DAMAGED  # the verdict expired during its slow write
    assert (await add(book, 1)).header() == "trialling (1 pair)"


class DiesAtPut:
    """A SharedState whose ``put`` fails (a replica dying while it writes a verdict)."""

    def __init__(self, inner: LocalState) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        raise RuntimeError("replica gone")


async def test_a_last_look_whose_decision_was_lost_is_trialled_afresh_a_look_later(
        local: LocalState, clock: Clock) -> None:
    dying = GuardBook(DiesAtPut(local), RULE, TTL, clock=clock)  # type: ignore[arg-type]
    await local.incr("guard:c:r:t:m:packed", 199 * pack(True, False))
    with pytest.raises(RuntimeError):
        await dying.add_pair("r", "t", "m", True, False)  # the last look's pair, never decided
    book = GuardBook(local, RULE, TTL, clock=clock)
    for n in range(201, 221):
        v = await book.add_pair("r", "t", "m", False, False)
        assert (v.state, v.pairs) == ("trialling", n) and "being decided" in v.reason
    assert (await book.verdicts("r", "t", ["m"]))["m"].pairs == 220
    assert await book.add_pair("r", "t", "m", False, False) == MoveVerdict(
        "m", "trialling", 0, 0.0, 0.0, 0.0, 0.0, DAMAGED)
    assert (await add(book, 20, move_changed=True, move="m")).header() == "off (20 pairs, 1.00 vs floor 0.00)"


@pytest.mark.parametrize("pairs,want", [(0, "0 pairs"), (1, "1 pair"), (2, "2 pairs"), (20, "20 pairs")])
def test_the_header_counts_pairs_in_english(pairs: int, want: str) -> None:
    assert MoveVerdict("m", "trialling", pairs, 0.0, 0.0, 0, 0, "").header() == f"trialling ({want})"
    assert MoveVerdict("m", "off", pairs, 0.5, 0.25, 1, 2, "").header() == f"off ({want}, 0.50 vs floor 0.25)"
