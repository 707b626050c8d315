"""Shared breakers and loads pinned point by point (issue 21): :mod:`prefixgate.proxy.routing.shared`.

Source of each rule: the module docstring — ``breaker:<dep>`` = ``"open|<unix s>|<reason>"``
with the cooldown as TTL when a breaker opens here, ``"closed|<unix s>|"`` when a probe here
closes it; a peer's opening applied once, for the rest of its cooldown, a stamp ahead of now
counting as now; ``fail:<dep>`` counted with INCRBY, TTL = ``window_s``, reaching
``consecutive_failures`` opens the breaker everywhere, reset by a success only when this
replica saw it non-zero; ``load:<dep>`` a table of each replica's own exact in-flight count
``"<n> <expires>"``, a crashed replica's entry ignored after its expiry or ``first seen +
load_ttl_s``, a live replica rewriting its entry when half the TTL has passed; one read
reused for ``max_age_s``. A recording store (LocalState underneath) shows every write with its
TTL; clocks are stepped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from prefixgate.cache.state.shared_state import LocalState
from prefixgate.config.routing import BreakerSettings
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import CLOSED, HALF_OPEN, OPEN, BreakerBoard
from prefixgate.proxy.routing.shared import TABLE_TTL_S, SharedRouting, others_load, parse_breaker

S = BreakerSettings(consecutive_failures=3, window_s=7.0, cooldown_s=30.0, min_requests=100)


class Recording(LocalState):
    """LocalState that logs every write and counts the reads."""

    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self.writes: list[tuple[str, ...]] = []
        self.reads = 0

    async def incr(self, name: str, by: int = 1, ttl_s: float | None = None) -> int:
        self.writes.append(("incr", name, str(by), str(ttl_s)))
        return await super().incr(name, by, ttl_s)

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        self.writes.append(("put", name, value, str(ttl_s)))
        await super().put(name, value, ttl_s)

    async def put_field(self, name: str, field: str, value: str, ttl_s: float | None = None) -> None:
        self.writes.append(("put_field", name, field, value, str(ttl_s)))
        await super().put_field(name, field, value, ttl_s)

    async def read_many(self, values: Sequence[str], tables: Sequence[str]) -> Any:
        self.reads += 1
        return await super().read_many(values, tables)


class World:
    def __init__(self, max_age_s: float = 0.0, load_ttl_s: float = 60.0) -> None:
        self.t = [0.0]
        self.store = Recording(lambda: self.t[0])
        self.loop = asyncio.new_event_loop()
        self.r = {n: SharedRouting(self.store, BreakerBoard(S, now=lambda: self.t[0]), Balancer(),
                                   replica=n, max_age_s=max_age_s, load_ttl_s=load_ttl_s,
                                   clock=lambda: 1000.0 + self.t[0]) for n in "ab"}

    def go(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def settle(self) -> None:
        for _ in range(5):
            self.go(asyncio.sleep(0))

    def fail(self, n: str, dep: str = "d") -> None:
        b = self.r[n].board.get(dep)
        was = b.state
        b.failure("status-503")
        self.go(self.r[n].failed(dep, was))

    def ok(self, n: str, dep: str = "d") -> None:
        b = self.r[n].board.get(dep)

        async def go() -> None:
            was = b.state
            b.success()
            self.r[n].succeeded(dep, was)

        self.go(go())
        self.settle()


def test_parse_breaker_values() -> None:
    assert parse_breaker("open|1000.500|status-503") == ("open", 1000.5, "status-503")
    assert parse_breaker("closed|12|") == ("closed", 12.0, "")
    assert parse_breaker("open|12|a|b") == ("open", 12.0, "a|b")
    assert parse_breaker("open|soon|x") is None and parse_breaker("") is None and parse_breaker(None) is None


def test_others_load_sums_live_entries_but_mine() -> None:
    """Live while now < min(expiry, first seen + ttl); negative counts count 0; junk skipped."""
    table = {"me": "9 2000", "b": "2 1050", "c": "3 1000", "d": "-4 2000", "e": "x 2000", "f": "1 y"}
    assert others_load(table, "me", 1000.0, ttl_s=60.0) == 2  # c expired at its instant, d -> 0
    assert others_load({"b": "2 1059.9"}, "me", 1000.0, ttl_s=60.0) == 2
    assert others_load({"b": "2 1070"}, "me", 1000.0, ttl_s=60.0) == 2  # clamped to now + 60
    seen: dict[tuple[str, str], float] = {}
    far = {"b": "5 99999999"}  # a clock a year ahead
    assert others_load(far, "me", 1000.0, 60.0, seen) == 5 and seen == {("b", "5 99999999"): 1000.0}
    assert others_load(far, "me", 1059.0, 60.0, seen) == 5
    assert others_load(far, "me", 1060.0, 60.0, seen) == 0  # a TTL after it was first seen
    assert others_load({"b": "6 99999999"}, "me", 1061.0, 60.0, seen) == 6  # rewritten: seen anew
    assert seen == {("b", "6 99999999"): 1061.0}  # the old text pruned
    assert others_load({"me": "4 99999999"}, "me", 0.0, 60.0, seen) == 0 and seen == {}


def test_an_opening_is_published_with_the_cooldown_as_ttl_and_applied_once_by_the_peer() -> None:
    w = World()
    for _ in range(3):
        w.fail("a")
    assert ("put", "breaker:d", "open|1000.000|status-503", "30.0") in w.store.writes
    assert w.store.writes[0] == ("incr", "fail:d", "1", "7.0")
    w.t[0] = 10.0
    w.go(w.r["b"].refresh(["d"]))
    b = w.r["b"].board.get("d")
    assert b.state == OPEN and b.opened_at == 0.0 and b.last_reason == "status-503 (another replica)"
    w.t[0] = 29.0
    assert not b.available()
    w.t[0] = 30.0
    assert b.available()
    b.before_send()
    w.go(w.r["b"].refresh(["d"]))  # the same news again: not re-applied
    assert b.state == HALF_OPEN


def test_a_stamp_ahead_of_now_counts_as_now() -> None:
    w = World()
    w.go(w.store.put("breaker:d", "open|5000.000|peer", 30.0))
    w.t[0] = 2.0
    w.go(w.r["b"].refresh(["d"]))
    b = w.r["b"].board.get("d")
    assert b.state == OPEN and b.opened_at == 2.0  # one cooldown from now, not from 5000


def test_an_old_opening_past_its_cooldown_is_ignored_and_a_closing_closes() -> None:
    w = World()
    w.go(w.store.put("breaker:d", "open|960.000|old", None))  # 40 s old at t=0 (cooldown 30)
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].board.get("d").state == CLOSED
    w.go(w.store.put("breaker:d", "open|990.000|recent", None))  # 10 s old
    w.go(w.r["b"].refresh(["d"]))
    b = w.r["b"].board.get("d")
    assert b.state == OPEN and b.opened_at == -10.0
    w.t[0] = 1.0
    w.go(w.store.put("breaker:d", "closed|1001.000|", None))
    w.go(w.r["b"].refresh(["d"]))
    assert b.state == CLOSED
    w.go(w.store.put("breaker:d", "open|995.000|older than the closing", None))
    w.go(w.r["b"].refresh(["d"]))
    assert b.state == CLOSED  # older than the news applied


def test_the_shared_streak_opens_the_breaker_where_it_is_reached() -> None:
    """a fails twice, b once: 3 in a row across replicas (consecutive_failures 3) opens b's
    breaker (b saw only one) and publishes the opening."""
    w = World()
    w.fail("a")
    w.fail("a")
    w.go(w.r["b"].refresh(["d"]))
    w.fail("b")
    b = w.r["b"].board.get("d")
    assert b.state == OPEN and "(3 in a row, all replicas)" in b.last_reason
    assert w.store.writes[-1][:2] == ("put", "breaker:d") and w.store.writes[-1][2].startswith("open|")
    assert w.r["a"].board.get("d").state == CLOSED  # until it reads
    w.go(w.r["a"].refresh(["d"]))
    assert w.r["a"].board.get("d").state == OPEN


def test_a_success_ends_the_streak_only_when_there_is_one() -> None:
    w = World()
    w.ok("a")
    assert w.store.writes == []  # closed, no streak seen: no I/O
    w.fail("a")
    w.ok("a")
    assert w.store.writes[-1] == ("put", "fail:d", "0", "7.0")
    n = len(w.store.writes)
    w.ok("a")
    assert len(w.store.writes) == n  # the streak is over already
    # a peer's streak seen on a read: ended by a success here
    w.fail("b")
    w.go(w.r["a"].refresh(["d"]))
    w.ok("a")
    assert w.store.writes[-1] == ("put", "fail:d", "0", "7.0")


def test_a_probe_success_publishes_the_closing_and_the_peer_closes() -> None:
    w = World()
    for _ in range(3):
        w.fail("a")
    w.go(w.r["b"].refresh(["d"]))
    w.t[0] = 30.0
    a = w.r["a"].board.get("d")
    a.before_send()
    assert a.state == HALF_OPEN
    w.ok("a")
    assert w.store.writes[-2:] == [("put", "fail:d", "0", "7.0"), ("put", "breaker:d", "closed|1030.000|", "30.0")]
    w.t[0] = 30.5
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].board.get("d").state == CLOSED


def test_a_failure_of_an_open_breaker_publishes_nothing_new() -> None:
    w = World()
    for _ in range(3):
        w.fail("a")
    n = sum(1 for x in w.store.writes if x[1] == "breaker:d")
    w.fail("a")  # already open: counted, not published again
    assert sum(1 for x in w.store.writes if x[1] == "breaker:d") == n == 1


def test_a_disabled_breaker_is_not_opened_by_the_streak() -> None:
    w = World()
    off = BreakerSettings(enabled=False, consecutive_failures=1)
    w.r["a"] = SharedRouting(w.store, BreakerBoard(off, now=lambda: w.t[0]), Balancer(), replica="a",
                             max_age_s=0.0, clock=lambda: 1000.0 + w.t[0])
    w.fail("a")
    assert w.r["a"].board.get("d").state == CLOSED
    assert not any(x[1] == "breaker:d" for x in w.store.writes)


def test_loads_are_written_as_own_exact_counts_and_read_by_the_peer() -> None:
    w = World(load_ttl_s=60.0)
    ra = w.r["a"]

    async def two() -> Any:
        r1 = ra.balancer.acquire("d")
        r2 = ra.balancer.acquire("d")
        await asyncio.sleep(0)
        return r1, r2

    r1, r2 = w.go(two())
    w.settle()
    assert ("put_field", "load:d", "a", "2 1060.000", str(TABLE_TTL_S)) in w.store.writes
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].balancer.others == {"d": 2} and w.r["b"].balancer.loads(["d"]) == [2]

    async def rel() -> None:
        r1()
        await asyncio.sleep(0)

    w.go(rel())
    w.settle()
    assert w.store.writes[-1][:4] == ("put_field", "load:d", "a", "1 1060.000")
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].balancer.others == {"d": 1}


def test_a_live_replica_rewrites_its_entry_after_half_the_ttl() -> None:
    w = World(load_ttl_s=60.0)
    ra = w.r["a"]

    async def take() -> None:
        ra.balancer.acquire("d")
        await asyncio.sleep(0)

    w.go(take())
    w.settle()
    n = len(w.store.writes)
    w.t[0] = 30.0
    w.go(ra.refresh(["d"]))
    w.settle()
    assert len(w.store.writes) == n  # exactly half: not yet
    w.t[0] = 30.5
    w.go(ra.refresh(["d"]))
    w.settle()
    assert w.store.writes[-1][:4] == ("put_field", "load:d", "a", "1 1090.500")
    # nothing in flight: no rewrite
    w2 = World(load_ttl_s=60.0)
    w2.t[0] = 100.0
    w2.go(w2.r["a"].refresh(["d"]))
    w2.settle()
    assert w2.store.writes == []


def test_one_read_is_reused_for_max_age_s_and_shared_by_concurrent_callers() -> None:
    w = World(max_age_s=5.0)
    ra = w.r["a"]
    w.go(ra.refresh(["d", "e"]))
    assert w.store.reads == 1
    w.t[0] = 4.9
    w.go(ra.refresh(["d", "e"]))
    assert w.store.reads == 1
    w.go(ra.refresh(["d"]))  # another group: its own read
    assert w.store.reads == 2
    w.t[0] = 5.0
    w.go(ra.refresh(["d", "e"]))
    assert w.store.reads == 3

    async def both() -> None:
        await asyncio.gather(ra.refresh(["x"]), ra.refresh(["x"]))

    w.go(both())
    assert w.store.reads == 4


def test_an_unreadable_streak_reads_as_zero() -> None:
    w = World()
    w.go(w.store.put("fail:d", "junk", None))
    w.go(w.r["a"].refresh(["d"]))
    w.ok("a")
    assert w.store.writes[-1] == ("put", "fail:d", "junk", "None")  # nothing to end: no write
    w.go(w.store.put("fail:d", "2", None))
    w.go(w.r["a"].refresh(["d"]))
    w.ok("a")
    assert w.store.writes[-1] == ("put", "fail:d", "0", "7.0")


def test_a_junk_entry_does_not_stop_the_sum() -> None:
    assert others_load({"a": "x 2000", "b": "2 2000", "c": "1 y", "d": "3 2000"}, "me", 1000.0) == 5


def test_an_opening_exactly_one_cooldown_old_is_over() -> None:
    w = World()
    w.go(w.store.put("breaker:d", "open|970.000|peer", None))  # now 1000: age 30 = cooldown
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].board.get("d").state == CLOSED
    w.go(w.store.put("breaker:d", "open|970.500|peer", None))  # age 29.5: still open
    w.go(w.r["b"].refresh(["d"]))
    assert w.r["b"].board.get("d").state == OPEN


def test_a_failed_load_write_is_logged_and_never_raised(caplog: Any) -> None:
    import logging

    w = World()

    async def broken(*a: Any, **k: Any) -> None:
        raise ConnectionError("down")

    w.store.put_field = broken  # type: ignore[method-assign]

    async def take() -> None:
        w.r["a"].balancer.acquire("d")
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="prefixgate.proxy"):
        w.go(take())
        w.settle()
    assert [r.getMessage() for r in caplog.records if r.name == "prefixgate.proxy"] == [
        "shared load write failed"]
    assert "ConnectionError" in caplog.text  # with its traceback


def test_each_deployment_of_a_group_reads_its_own_streak() -> None:
    """Group [d, e]: e's streak (2) is read into e, d's absence as 0: a success on e ends it,
    one on d writes nothing."""
    w = World()
    w.go(w.store.put("fail:e", "2", None))
    w.go(w.r["a"].refresh(["d", "e"]))
    n = len(w.store.writes)
    w.ok("a", "d")
    assert len(w.store.writes) == n  # d: no streak read, nothing to end
    w.ok("a", "e")
    assert w.store.writes[-1] == ("put", "fail:e", "0", "7.0")


def test_the_streak_opening_starts_now_and_is_published_with_its_reason() -> None:
    w = World()
    w.fail("a")
    w.fail("a")
    w.t[0] = 3.0
    w.go(w.r["b"].refresh(["d"]))
    w.fail("b")
    b = w.r["b"].board.get("d")
    assert b.state == OPEN and b.opened_at == 3.0
    assert w.store.writes[-1] == ("put", "breaker:d", "open|1003.000|status-503 (3 in a row, all replicas)", "30.0")


class SlowRead(Recording):
    async def read_many(self, values: Any, tables: Any) -> Any:
        self.reads += 1
        await asyncio.sleep(0.01)
        return await LocalState.read_many(self, values, tables)


def test_concurrent_refreshes_share_one_read() -> None:
    w = World(max_age_s=0.0)
    w.store = SlowRead(lambda: w.t[0])
    ra = SharedRouting(w.store, BreakerBoard(S, now=lambda: w.t[0]), Balancer(), replica="a", max_age_s=0.0,
                       clock=lambda: 1000.0 + w.t[0])

    async def both() -> None:
        await asyncio.gather(ra.refresh(["d"]), ra.refresh(["d"]), ra.refresh(["d"]))

    w.go(both())
    assert w.store.reads == 1 and ra._reading == {}


def test_a_streak_end_in_flight_is_kept_until_done() -> None:
    w = World()
    w.fail("a")
    ra = w.r["a"]
    b = ra.board.get("d")

    async def go() -> None:
        was = b.state
        b.success()
        ra.succeeded("d", was)
        assert len(ra._tasks) == 1 and None not in ra._tasks
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    w.go(go())
    w.settle()
    assert ra._tasks == set()


def test_no_streak_read_means_none_to_end() -> None:
    w = World()
    w.go(w.r["a"].refresh(["d"]))  # nothing stored under fail:d
    w.ok("a")
    assert w.store.writes == []
