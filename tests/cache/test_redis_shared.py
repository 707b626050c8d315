"""Shared state in real Redis: counters / values between replicas, and an outage mid-test —
requests served on local state, one log line, the metric, recovery after Redis restarts.

The outage is simulated on a private ``redis-server`` started on a free port (the shared one at
127.0.0.1:6379, used by other tests, is never stopped)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.state.redis_link import RETRY_EVERY_S, RedisLink
from prefixgate.cache.state.shared_state import LocalState, RedisState
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from tests.proxy.upstream import Script, ScriptedUpstream, completion
from tests.servers import serve_app

SHARED = "redis://127.0.0.1:6379/0"


def _shared_redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(SHARED).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A ``redis-server`` subprocess on ``port`` that a test may stop and start again."""

    def __init__(self, port: int) -> None:
        self.port, self.proc = port, None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(  # type: ignore[assignment]
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # type: ignore[unreachable]
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    r = PrivateRedis(_free_port())
    r.start()
    try:
        yield r
    finally:
        r.stop()


def test_two_replicas_share_counters_and_values() -> None:
    _shared_redis_or_skip()
    prefix = f"test-{uuid.uuid4().hex}:"

    async def run() -> None:
        a, b = RedisState(RedisLink(SHARED, prefix)), RedisState(RedisLink(SHARED, prefix))
        try:
            assert await a.incr("load:d1") == 1
            assert await b.incr("load:d1", 2) == 3
            assert await a.incr("load:d1", -1) == 2 and await b.count("load:d1") == 2
            await a.put("breaker:d1", "open", ttl_s=0.2)
            assert await b.get("breaker:d1") == "open"
            await asyncio.sleep(0.3)
            assert await b.get("breaker:d1") is None  # the cooldown expired in Redis
            assert await a.incr("fail:d1", 1, ttl_s=0.2) == 1
            await asyncio.sleep(0.3)
            assert await b.count("fail:d1") == 0
        finally:
            keys = await a.link.client.keys(prefix + "*")
            if keys:
                await a.link.client.delete(*keys)
            await a.link.close()
            await b.link.close()

    asyncio.run(run())


def test_local_state_counts_and_expires() -> None:
    now = [0.0]
    s = LocalState(clock=lambda: now[0])

    async def run() -> None:
        assert await s.incr("c", 5, ttl_s=10) == 5
        now[0] = 9.9
        assert await s.count("c") == 5
        now[0] = 10.0
        assert await s.count("c") == 0
        await s.put("v", "open")
        assert await s.get("v") == "open" and await s.get("nope") is None

    asyncio.run(run())


def test_state_falls_back_to_local_while_redis_is_down(private_redis: PrivateRedis) -> None:
    async def run() -> None:
        link = RedisLink(private_redis.url, "t:", retry_every_s=0.2)
        st = RedisState(link)
        assert await st.incr("x") == 1
        private_redis.stop()
        assert await st.incr("x") == 1  # the local counter: this replica counts alone
        assert await st.incr("x") == 2 and not link.up and link.outages == 1
        private_redis.start()
        await asyncio.sleep(0.25)
        assert await st.incr("x") == 1  # the new (empty) Redis again
        assert link.up
        await link.close()

    asyncio.run(run())


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def test_redis_outage_mid_test_serves_requests_and_recovers(
        private_redis: PrivateRedis, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import redis

    from prefixgate.rewriter.types import Edit, RewriteResult

    views: list[dict[str, Any]] = []

    def remembering(body: Any, api: str, ctx: Any) -> RewriteResult:
        views.append(dict(ctx.session))
        return RewriteResult(body, [Edit("count", False, "params", "x",
                                         memory={"n": ctx.session.get("n", 0) + 1})])

    up = ScriptedUpstream(script=Script(body=completion()))
    prefix = f"test-{uuid.uuid4().hex}:"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    caplog.set_level(logging.WARNING, logger="prefixgate.redis")
    with serve_app(up.app()) as up_url:
        policy = parse_policy({
            "backends": {"e": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
            "routes": [{"match": "*", "backend": "e"}],
            "ledger": {"path": str(tmp_path / "l.sqlite"), "redis_url": private_redis.url,
                       "redis_prefix": prefix},
            "meaning_guard": {"enabled": False}})  # its trials run the rewrite fn too (issue 36)
        with serve_app(build_app(policy, rewrite_fn=remembering)) as url:
            def ask() -> int:
                return httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                                  headers={"x-prefixgate-session": "s"}).status_code

            assert ask() == 200 and _metric(url, "prefixgate_redis_up") == 1
            stored = redis.Redis.from_url(private_redis.url).get(prefix + "session:s")
            assert stored is not None and b'"n":1' in stored
            private_redis.stop()
            assert [ask(), ask(), ask()] == [200, 200, 200]  # served on local state
            assert _metric(url, "prefixgate_redis_up") == 0
            assert _metric(url, "prefixgate_redis_outages_total") == 1
            assert _metric(url, "prefixgate_redis_fallbacks_total") >= 3
            down = [r for r in caplog.records if "redis unavailable" in r.getMessage()]
            assert len(down) == 1  # one line per outage, not per request
            private_redis.start()  # empty: the sessions Redis had are gone
            time.sleep(RETRY_EVERY_S + 0.1)
            assert ask() == 200
            assert _metric(url, "prefixgate_redis_up") == 1
            assert any("redis recovered" in r.getMessage() for r in caplog.records)
            stored = redis.Redis.from_url(private_redis.url).get(prefix + "session:s")
    assert views == [{}, {"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]  # memory never lost
    assert stored is not None and b'"n"' in stored  # written to Redis again after recovery
