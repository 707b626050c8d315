"""Breakers and affinity load shared by proxy replicas (issue 10, item 6; routing.shared).

Units on one LocalState standing for the shared store (injected clock); then two proxy apps on
the real Redis at 127.0.0.1:6379 (a unique key prefix, deleted after) that see each other's
sessions and breakers; then a private redis-server stopped mid-test (the shared one never is).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from prefixgate.cache.state.redis_link import RETRY_EVERY_S
from prefixgate.cache.state.shared_state import LocalState
from prefixgate.config.loader import parse_policy
from prefixgate.config.routing import BreakerSettings
from prefixgate.proxy.app import build_app
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import CLOSED, OPEN, BreakerBoard
from prefixgate.proxy.routing.shared import SharedRouting, others_load, parse_breaker
from prefixgate.rewriter.types import Edit, RewriteResult
from tests.cache.test_redis_shared import (
    SHARED,
    PrivateRedis,
    _metric,
    _shared_redis_or_skip,
    private_redis,  # noqa: F401 - the fixture
)
from tests.faults.conftest import body_for
from tests.faults.fault_server import FaultServer, serve_faults
from tests.servers import serve_app

SETTINGS = BreakerSettings(consecutive_failures=2, cooldown_s=30.0)


def _replica(store: LocalState, name: str, now: list[float]) -> SharedRouting:
    board, bal = BreakerBoard(SETTINGS, now=lambda: now[0]), Balancer()
    return SharedRouting(store, board, bal, replica=name, max_age_s=0.0,
                         clock=lambda: 1000.0 + now[0])


def test_a_breaker_opened_on_one_replica_is_open_on_the_other() -> None:
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    a, b = _replica(store, "a", now), _replica(store, "b", now)

    async def run() -> None:
        for _ in range(2):
            was = a.board.get("d1").state
            a.board.get("d1").failure("status-503")
            await a.failed("d1", was)
        assert a.board.get("d1").state == OPEN
        await b.refresh(["d1", "d2"])
        assert b.board.get("d1").state == OPEN and not b.board.get("d1").available()
        assert "another replica" in b.board.down()["d1"]
        assert b.board.get("d2").state == CLOSED
        now[0] = 30.0  # the cooldown is over on both: each lets its own probe through
        assert b.board.get("d1").available() and a.board.get("d1").available()

    asyncio.run(run())


def test_failures_spread_over_replicas_open_the_breaker_and_a_success_ends_the_streak() -> None:
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    a, b = _replica(store, "a", now), _replica(store, "b", now)

    async def fail(r: SharedRouting) -> None:
        was = r.board.get("d1").state
        r.board.get("d1").failure("connect")
        await r.failed("d1", was)

    async def run() -> None:
        await fail(a)
        await b.refresh(["d1"])
        b.board.get("d1").success()
        b.succeeded("d1", CLOSED)  # b saw a streak of 1: it ends it
        await asyncio.sleep(0)
        assert await store.get("fail:d1") == "0"
        await fail(a)
        await fail(b)  # one failure each, two in a row across replicas
        assert b.board.get("d1").state == OPEN
        await a.refresh(["d1"])
        assert a.board.get("d1").state == OPEN

    asyncio.run(run())


def test_loads_are_shared_and_a_crashed_replicas_entry_expires() -> None:
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    a, b = _replica(store, "a", now), _replica(store, "b", now)

    async def run() -> None:
        releases = [a.balancer.acquire("d1") for _ in range(3)]
        await asyncio.sleep(0.01)  # the coalescing writer
        await b.refresh(["d1", "d2"])
        b.balancer.acquire("d2")
        assert b.balancer.loads(["d1", "d2"]) == [3, 1]
        releases[0]()
        await asyncio.sleep(0.01)
        await b.refresh(["d1", "d2"])
        assert b.balancer.loads(["d1", "d2"]) == [2, 1]
        now[0] = a.load_ttl_s + 1  # replica a "crashed": no write since
        await b.refresh(["d1", "d2"])
        assert b.balancer.loads(["d1", "d2"]) == [0, 1]

    asyncio.run(run())


def test_value_parsing() -> None:
    assert parse_breaker("open|12.5|status-503") == ("open", 12.5, "status-503")
    assert parse_breaker(None) is None and parse_breaker("open|x|") is None
    assert others_load({"a": "2 100", "b": "5 50", "me": "9 100", "c": "junk"}, "me", 60) == 2


# ---- two proxy apps on Redis --------------------------------------------------------------

def _policy(ua: str, ub: str, tmp: Path, tag: str, url: str, prefix: str) -> Any:
    return parse_policy({
        "backends": {"g": {"kind": "openai_compat", "deployments": [
            {"base_url": ua + "/v1", "name": "ga"}, {"base_url": ub + "/v1", "name": "gb"}],
            "affinity": {"mode": "round_robin"}}},
        "routes": [{"match": "*", "backend": "g"}],
        "retry": {"attempts": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02},
        "breaker": {"consecutive_failures": 2, "cooldown_s": 60.0},
        "ledger": {"path": str(tmp / f"{tag}.sqlite"), "redis_url": url, "redis_prefix": prefix}})


def _remembering(body: Any, api: str, ctx: Any) -> RewriteResult:
    return RewriteResult(body, [Edit("count", False, "params", "x",
                                     memory={"n": ctx.session.get("n", 0) + 1})])


class Fleet:
    """Two proxy apps (replicas A and B) over deployments ga / gb, on Redis ``url``."""

    def __init__(self, stack: ExitStack, tmp: Path, url: str, prefix: str) -> None:
        self.ga, self.gb = FaultServer(stall_s=30), FaultServer(stall_s=30)
        ua, ub = stack.enter_context(serve_faults(self.ga)), stack.enter_context(
            serve_faults(self.gb))
        self.apps = [build_app(_policy(ua, ub, tmp, t, url, prefix), rewrite_fn=_remembering,
                               analyze=False) for t in ("a", "b")]
        self.a, self.b = (stack.enter_context(serve_app(app)) for app in self.apps)

    def ask(self, url: str, session: str = "s") -> int:
        path = "/v1/chat/completions"
        return httpx.post(url + path, json=body_for(path, "ok", False), timeout=30,
                          headers={"x-prefixgate-session": session}).status_code

    def open_ga_through_a(self) -> None:
        self.ga.force, start = "status-503", self.ga.requests
        while self.ga.requests < start + 2:
            assert self.ask(self.a) == 200  # gb answers each failed one
        assert list(httpx.get(self.a + "/healthz").json()["down"]) == ["ga"]


def test_two_replicas_on_redis_share_sessions_and_breakers(tmp_path: Path) -> None:
    import redis

    _shared_redis_or_skip()
    prefix = f"test-{uuid.uuid4().hex}:"
    try:
        with ExitStack() as stack:
            f = Fleet(stack, tmp_path, SHARED, prefix)
            assert f.ask(f.a, "s1") == 200 and f.ask(f.b, "s1") == 200
            stored = redis.Redis.from_url(SHARED).get(prefix + "session:s1")
            assert stored is not None and b'"n":2' in stored  # B merged onto A's memory
            f.open_ga_through_a()
            before = f.ga.requests
            for _ in range(6):  # round robin on B: ga's turn comes 3 times
                assert f.ask(f.b) == 200
            assert f.ga.requests == before  # B routes around the deployment A saw fail
            down = httpx.get(f.b + "/healthz").json()["down"]
            assert list(down) == ["ga"] and "another replica" in down["ga"]
    finally:
        r = redis.Redis.from_url(SHARED)
        keys = r.keys(prefix + "*")
        if keys:
            r.delete(*keys)


def test_redis_stopped_mid_test_replicas_serve_then_share_again(
        private_redis: PrivateRedis, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    prefix = f"test-{uuid.uuid4().hex}:"
    with ExitStack() as stack:
        f = Fleet(stack, tmp_path, private_redis.url, prefix)
        assert f.ask(f.a) == 200 and f.ask(f.b) == 200
        private_redis.stop()
        assert [f.ask(u) for u in (f.a, f.b, f.a, f.b)] == [200] * 4  # served on local state
        for u in (f.a, f.b):
            assert _metric(u, "prefixgate_redis_up") == 0
            assert _metric(u, "prefixgate_redis_outages_total") == 1
        private_redis.start()
        time.sleep(RETRY_EVERY_S + 0.1)
        assert f.ask(f.a) == 200 and f.ask(f.b) == 200
        assert _metric(f.a, "prefixgate_redis_up") == 1 == _metric(f.b, "prefixgate_redis_up")
        f.open_ga_through_a()  # shared again after the restart
        before = f.ga.requests
        for _ in range(4):
            assert f.ask(f.b) == 200
        assert f.ga.requests == before


def test_local_state_makes_no_shared_routing(tmp_path: Path) -> None:
    policy = parse_policy({"backends": {"e": {"kind": "openai_compat",
                                              "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "e"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite")}})
    state = build_app(policy, rewrite_fn=None, analyze=False).state.proxy
    assert state.routing is None and state.balancer.on_change is None


def test_a_probe_that_closes_the_breaker_on_one_replica_closes_it_on_the_other() -> None:
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    a, b = _replica(store, "a", now), _replica(store, "b", now)

    async def run() -> None:
        for _ in range(2):
            a.board.get("d1").failure("status-503")
            await a.failed("d1", CLOSED)
        await b.refresh(["d1"])
        assert b.board.get("d1").state == OPEN
        now[0] = 31.0  # a's cooldown is over: its probe succeeds
        brk = a.board.get("d1")
        brk.before_send()
        was = brk.state
        brk.success()
        a.succeeded("d1", was)
        await asyncio.sleep(0.01)
        await b.refresh(["d1"])
        assert b.board.get("d1").state == CLOSED and b.board.down() == {}

    asyncio.run(run())


# ---- clocks of other replicas (issue 20, low) ----------------------------------------------

def _route_twelve(r: SharedRouting) -> dict[str, int]:
    """Where 12 new sessions go on group (d1, d2) with the loads ``r`` last read."""
    from prefixgate.config.routing import AffinitySettings
    from prefixgate.proxy.routing.balance import choose

    names, got = ["d1", "d2"], {"d1": 0, "d2": 0}
    for i in range(12):
        c = choose(names, r.balancer.loads(names), f"session-{i}", AffinitySettings())
        got[names[c.index]] += 1
    return got


def test_a_load_entry_expiring_far_ahead_stops_counting_after_its_ttl() -> None:
    """A replica whose clock is a year ahead wrote d1 busy and died: its entry counts for one
    TTL (as any crashed replica's), then routing spreads again (12 of 12 went to d2 before)."""
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    b = _replica(store, "b", now)
    year = 365 * 86_400.0

    async def run() -> None:
        await store.put_field("load:d1", "skewed", f"1000 {1000.0 + year:.3f}")
        await b.refresh(["d1", "d2"])
        assert b.balancer.loads(["d1", "d2"]) == [1000, 0]  # fresh: counted, as it says
        assert _route_twelve(b) == {"d1": 0, "d2": 12}
        now[0] = b.load_ttl_s - 1
        await b.refresh(["d1", "d2"])
        assert b.balancer.loads(["d1", "d2"]) == [1000, 0]
        now[0] = b.load_ttl_s + 1  # one TTL after it was first seen, unchanged since
        await b.refresh(["d1", "d2"])
        assert b.balancer.loads(["d1", "d2"]) == [0, 0]
        spread = _route_twelve(b)
        assert spread["d1"] > 0 and spread["d2"] > 0, spread

    asyncio.run(run())


def test_a_skewed_live_replica_keeps_counting_while_it_rewrites() -> None:
    """Not in the issue: the clamp must not drop a LIVE replica whose clock is ahead: each of
    its rewrites is a new entry text, first seen anew."""
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    a = SharedRouting(store, BreakerBoard(SETTINGS, now=lambda: now[0]), Balancer(),
                      replica="a", max_age_s=0.0, clock=lambda: 1000.0 + 3600.0 + now[0])
    b = _replica(store, "b", now)

    async def run() -> None:
        for _ in range(2):
            a.balancer.acquire("d1")
        for step in range(1, 6):  # 5 half-TTLs; a refreshes (and so rewrites) on each send
            now[0] = step * (a.load_ttl_s / 2 + 1)
            await a.refresh(["d1"])
            await asyncio.sleep(0.01)
            await b.refresh(["d1", "d2"])
            assert b.balancer.loads(["d1", "d2"]) == [2, 0], step

    asyncio.run(run())


def test_breaker_news_stamped_in_the_future_opens_one_cooldown_and_hides_nothing() -> None:
    """Not in the issue: an opening stamped a day ahead opened the breaker here, and every later
    closing (stamped by a right clock, so "older") was ignored until that day came."""
    now = [0.0]
    store = LocalState(clock=lambda: now[0])
    b = _replica(store, "b", now)

    async def run() -> None:
        await store.put("breaker:d1", f"open|{1000.0 + 86_400:.3f}|status-503", 300)
        await b.refresh(["d1"])
        assert b.board.get("d1").state == OPEN
        now[0] = SETTINGS.cooldown_s + 0.5  # one cooldown later: this replica probes again
        await b.refresh(["d1"])  # the same news read again is not applied again
        assert b.board.get("d1").available()
        b.board.get("d1").state = OPEN  # (open here again, say) then a right clock closes it
        await store.put("breaker:d1", f"closed|{1000.0 + now[0]:.3f}|", 300)
        await b.refresh(["d1"])
        assert b.board.get("d1").state == CLOSED

    asyncio.run(run())


def test_load_entries_parse_safely() -> None:
    far = {"x": "7 1e300", "y": "3 inf", "z": "4 nan", "w": "-5 1e300"}
    assert others_load(far, "me", 60.0) == 10          # clamped to now + TTL: still live now
    seen: dict[tuple[str, str], float] = {}
    assert others_load(far, "me", 60.0, 10.0, seen) == 10
    assert others_load(far, "me", 71.0, 10.0, seen) == 0  # one TTL after first seen
    assert others_load({"x": "7 1e300"}, "me", 72.0, 10.0, seen) == 0
    assert list(seen) == [("x", "7 1e300")]             # pruned to the table's entries
