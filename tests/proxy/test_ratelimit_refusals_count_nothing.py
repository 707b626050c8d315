"""A refused request uses none of its key's budget, whichever limit refused it and whichever
limiter counts (issue 38 item 1: with Redis, a request refused for *tokens* still took one of its
key's requests per minute; the old test met one token refusal and never read the request count).

The dimension varied: the limiter (in-process counters, Redis) x the limit that refuses
(requests, tokens) x how many refusals come before the next admitted request.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.proxy.http.ratelimit import MemoryLimiter, RedisLimiter
from tests.proxy.test_auth_and_limits import _redis

T0 = 1_800.0 + 7  # seven seconds into a minute window: no turnover within a test


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Rig:
    """One limiter and a reader of its counters ``(requests, tokens)`` in the current window."""

    def __init__(self, kind: str) -> None:
        self.kind, self.clock, self.key = kind, Clock(T0), "k_" + uuid.uuid4().hex[:8]
        self.prefix = f"pgtest-{uuid.uuid4().hex[:8]}:"
        self.loop = asyncio.new_event_loop()
        if kind == "memory":
            self.lim: Any = MemoryLimiter(self.clock)
        else:
            self.client = _redis()
            self.link = RedisLink("redis://127.0.0.1:6379/0", self.prefix)
            self.lim = RedisLimiter(self.link, clock=self.clock)

    def admit(self, rpm: int | None, tpm: int | None, tokens: int = 0) -> str | None:
        got = self.loop.run_until_complete(self.lim.admit(self.key, rpm, tpm, tokens))
        return None if got is None else got.kind

    def add_tokens(self, n: int) -> None:
        async def go() -> None:
            self.lim.add_tokens(self.key, n)
            if self.kind == "redis":
                await self.lim.drain()
        self.loop.run_until_complete(go())

    def used(self) -> tuple[int, int]:
        if self.kind == "memory":
            return tuple(self.lim.used(self.key))  # type: ignore[return-value]
        req, tok = self.lim.keys(self.key, self.lim.window())
        return int(self.client.get(req) or 0), int(self.client.get(tok) or 0)

    def close(self) -> None:
        if self.kind == "redis":
            self.loop.run_until_complete(self.link.close())
            for k in self.client.scan_iter(f"{self.prefix}*"):
                self.client.delete(k)
        self.loop.close()


@pytest.fixture(params=["memory", "redis"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(request.param)
    yield r
    r.close()


@pytest.mark.parametrize("refusals", [1, 3])
def test_a_request_refused_for_tokens_takes_none_of_the_key_s_requests(rig: Rig, refusals: int) -> None:
    assert rig.admit(rpm=2, tpm=100, tokens=40) is None
    rig.add_tokens(80)  # the answer's tokens: 120 used, over the 100 tpm
    assert rig.used() == (1, 120)
    for _ in range(refusals):
        assert rig.admit(rpm=2, tpm=100, tokens=5) == "tokens"
    assert rig.used() == (1, 120)  # neither the request nor its prompt estimate was charged
    # the key's second request of the minute is still there once tokens are not the limit
    assert rig.admit(rpm=2, tpm=None, tokens=5) is None
    assert rig.used() == (2, 125)
    assert rig.admit(rpm=2, tpm=None) == "requests"


@pytest.mark.parametrize("refusals", [1, 3])
def test_a_request_refused_for_requests_charges_no_tokens(rig: Rig, refusals: int) -> None:
    assert rig.admit(rpm=1, tpm=1_000, tokens=30) is None
    for _ in range(refusals):
        assert rig.admit(rpm=1, tpm=1_000, tokens=50) == "requests"
    assert rig.used() == (1, 30)
