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

from prefixgate.cache.redis_link import RETRY_EVERY_S
from prefixgate.cache.shared_state import LocalState
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
