"""Issue 20 Medium 12: a Redis that accepts connections and never answers stalled each
rate-limited request 5.6 s (the limiter's own sync client, 5 s timeout, no outage state).

Every Redis user now goes through the app's one :class:`prefixgate.cache.state.redis_link.RedisLink`
(``redis.asyncio``, 0.5 s per operation, one outage state): the rate limiter, session memory,
the shared routing state (breakers, loads). Each is tested against :class:`HungRedis` — a
loopback TCP server that accepts and never replies — for a bounded time: the first operation
waits out the timeout, the ones after it during the outage return their local fallback at once.
(The ledger is SQLite / PostgreSQL and does not use Redis.)"""

from __future__ import annotations

import asyncio
import logging
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.state.redis_link import OP_TIMEOUT_S, RedisLink
from prefixgate.cache.state.session_redis import SharedSessionStore
from prefixgate.cache.state.shared_state import RedisState
from prefixgate.config.schema import AuthSettings, BreakerSettings, ProxyKey
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import Guard, KeyStore, hash_key
from prefixgate.proxy.http.ratelimit import RedisLimiter
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.shared import SharedRouting
from tests.proxy.conftest import make_policy
from tests.proxy.upstream import Script, completion
from tests.servers import serve_app

KEY = "pgk-redis-hang-0123456789abcdefghijklmnopqrstuvwxyz"
SLACK_S = 0.4  # scheduling on a shared 2-core machine


class HungRedis:
    """A loopback TCP server that accepts every connection, reads what comes and never answers
    (a Redis stuck in a long command, a half-dead proxy in front of one). ``url``; ``accepted``
    counts connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)  # held open, never written to

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for c in self._conns:
            c.close()
        self.sock.close()


@pytest.fixture
def hung() -> Iterator[HungRedis]:
    server = HungRedis()
    yield server
    server.close()


async def _timed(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - t0


def test_the_rate_limiter_on_a_hung_redis_limits_locally_within_the_timeout(
        hung: HungRedis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "prefixgate.redis")

    async def run() -> None:
        link = RedisLink(hung.url, "pgtest:")
        lim = RedisLimiter(link)
        first, t_first = await _timed(lim.admit("k", 3, None))
        assert first is None and t_first < OP_TIMEOUT_S + SLACK_S and not link.up
        rest = [await _timed(lim.admit("k", 3, None)) for _ in range(10)]
        assert max(t for _, t in rest) < 0.05  # the outage state: no network call
        assert [r is None for r, _ in rest[:2]] == [True, True]
        assert all(r is not None and r.kind == "requests" for r, _ in rest[2:])  # local rpm 3
        lim.add_tokens("k", 10)
        _, t_drain = await _timed(lim.drain())
        assert t_drain < OP_TIMEOUT_S + SLACK_S
        await link.close()

    asyncio.run(run())
    assert hung.accepted >= 1  # it really did reach the hung server
    assert sum("redis unavailable" in r.getMessage() for r in caplog.records) == 1


def test_the_guard_settles_on_a_hung_redis_without_waiting(hung: HungRedis) -> None:
    async def run() -> None:
        link = RedisLink(hung.url, "pgtest:")
        key = ProxyKey(id="k_h", hash=hash_key(KEY), tpm=100_000)
        guard = Guard(KeyStore(AuthSettings(keys=[key])), RedisLimiter(link))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi " * 100}]}
        ticket, t = await _timed(guard.limit("k_h", body, 0))
        assert ticket is not None and t < OP_TIMEOUT_S + SLACK_S
        t0 = time.perf_counter()
        guard.settle(ticket, 10, 5, 200)  # sync: the write goes to a background task
        assert time.perf_counter() - t0 < 0.05
        assert isinstance(guard.limiter, RedisLimiter)
        await guard.limiter.drain()
        await link.close()

    asyncio.run(run())


def test_session_memory_on_a_hung_redis_answers_from_the_local_copy(hung: HungRedis) -> None:
    async def run() -> None:
        link = RedisLink(hung.url, "pgtest:")
        store = SharedSessionStore(link)
        _, t_merge = await _timed(store.amerge("s", {"n": 1}))
        got, t_get = await _timed(store.aget("s"))
        assert dict(got) == {"n": 1}  # the local copy
        assert t_merge < OP_TIMEOUT_S + SLACK_S and t_get < 0.05
        await link.close()

    asyncio.run(run())


def test_shared_routing_state_on_a_hung_redis_falls_back_to_local_state(hung: HungRedis) -> None:
    async def run() -> None:
        link = RedisLink(hung.url, "pgtest:")
        state = RedisState(link)
        _, t_first = await _timed(state.incr("fail:d", 1, 30))
        assert t_first < OP_TIMEOUT_S + SLACK_S
        t0 = time.perf_counter()
        assert await state.incr("fail:d", 1, 30) == 2  # the local counter (1 from the first)
        await state.put("breaker:d", "open|1|x", 5)
        assert await state.get("breaker:d") == "open|1|x"
        await state.put_field("load:d", "r1", "3 9999999999", 60)
        vals, tabs = await state.read_many(["breaker:d"], ["load:d"])
        assert vals == ["open|1|x"] and tabs == [{"r1": "3 9999999999"}]
        routing = SharedRouting(state, BreakerBoard(BreakerSettings()), Balancer())
        await routing.refresh(["d"])
        await routing.failed("d", "closed")
        assert time.perf_counter() - t0 < 0.2  # all answered locally, no timeout each
        await link.close()

    asyncio.run(run())


def test_a_proxy_on_a_hung_redis_serves_rate_limited_requests_without_stalling(
        hung: HungRedis, tmp_path: Path, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the case end to end: rate limits + sessions + shared routing all on the hung Redis
    up, up_url = upstream
    up.script = Script(body=completion())
    key = {"id": "k_h", "hash": hash_key(KEY), "rpm": 1000, "tpm": 10_000_000}
    policy = make_policy(up_url, tmp_path / "l.sqlite", auth={"keys": [key]},
                         ledger={"path": str(tmp_path / "l.sqlite"), "redis_url": hung.url,
                                 "redis_prefix": f"pgtest-{uuid.uuid4().hex[:6]}:"})
    app = build_app(policy, ledger=Ledger(policy.ledger.path), rewrite_fn=None, analyze=False)
    times: list[float] = []
    with serve_app(app) as url, httpx.Client(timeout=30) as c:
        for i in range(12):
            t0 = time.perf_counter()
            r = c.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}",
                                                               "x-prefixgate-session": f"s{i % 2}"},
                       json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200
        metrics = c.get(url + "/metrics").text
    # before: 5.6 s each; now: the first waits one 0.5 s timeout, then one retry a second
    assert max(times) < 2 * OP_TIMEOUT_S + SLACK_S, times
    assert statistics.median(times) < 0.25, times
    assert sum(times) < 12 * 0.1 + 4 * OP_TIMEOUT_S + SLACK_S, times
    assert "prefixgate_redis_up 0.0" in metrics
