"""Shared state for the guard's tests: in process (with a fake clock), and in the real Redis at
127.0.0.1:6379 under a fresh key prefix (skipped when none answers, as tests/cache do)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.cache.state.shared_state import LocalState, RedisState

SHARED = "redis://127.0.0.1:6379/0"


class Clock:
    """A settable clock (seconds)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Yielding:
    """A SharedState that yields to the event loop before and after every operation, as a
    network round trip would, so that concurrent callers interleave between their operations."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.inner, name)

        async def call(*args: Any, **kw: Any) -> Any:
            await asyncio.sleep(0)
            out = await op(*args, **kw)
            await asyncio.sleep(0)
            return out
        return call


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def local(clock: Clock) -> LocalState:
    return LocalState(clock=clock)


@pytest.fixture
async def redis_states() -> AsyncIterator[Sequence[RedisState]]:
    """Two RedisStates (two replicas) on one fresh prefix; its keys are deleted after."""
    import redis

    try:
        redis.Redis.from_url(SHARED).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")
    prefix = f"test-guard-{uuid.uuid4().hex}:"
    # a generous per-operation timeout: on a loaded box a slow round trip would otherwise count
    # as an outage and the replica would fall back to counting alone (by design, not under test)
    states = [RedisState(RedisLink(SHARED, prefix, op_timeout_s=10.0)) for _ in range(2)]
    try:
        yield states
    finally:
        keys = await states[0].link.client.keys(prefix + "*")
        if keys:
            await states[0].link.client.delete(*keys)
        for s in states:
            await s.link.close()
