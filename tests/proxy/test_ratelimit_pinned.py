"""Rate limits pinned point by point (issue 21): :mod:`prefixgate.proxy.http.ratelimit`.

Source of each rule: the module docstring and :class:`Limiter` — fixed one-minute windows
``floor(now / 60)``; admitted while the key has made fewer than ``rpm`` requests and used fewer
than ``tpm`` tokens in the window; ``pending`` added first, whatever the verdict; a refused
request is not counted; ``retry_after_s`` = whole seconds to the next window, rounded up, at
least 1; windows older than the previous one forgotten; ``add_tokens`` never below 0 and never
into a forgotten window. The Redis limiter is driven through a fake link (the Lua scripts run in
Redis and are held by tests/adversarial/test_redis_hang.py against a real one): its arguments,
its verdicts and its fallback to the local counters. Tokens of a request: JSON text / 4,
rounded up.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prefixgate.proxy.http import ratelimit as rl
from prefixgate.proxy.http.ratelimit import (
    WINDOW_S,
    MemoryLimiter,
    RedisLimiter,
    Refusal,
    Ticket,
    estimate_now,
    prompt_estimate,
    window_of,
)


def test_window_of_and_retry_after_rounding() -> None:
    """Window 16 spans [960, 1020): at 960.0 60 s are left; at 961.2, 58.8 -> 59 (up); at
    1019.5, 0.5 -> 1; never below 1."""
    assert window_of(960.0) == (16, 60)
    assert window_of(961.2) == (16, 59)
    assert window_of(1019.5) == (16, 1)
    assert window_of(1019.999) == (16, 1)
    assert window_of(1020.0) == (17, 60)
    assert window_of(59.0) == (0, 1)


def test_rpm_admits_exactly_rpm_and_a_refusal_is_not_counted() -> None:
    now = [960.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    assert [lim.admit_now("k", 2, None) for _ in range(2)] == [None, None]
    now[0] = 1000.4
    assert lim.admit_now("k", 2, None) == Refusal("requests", 2, 20)  # 19.6 s left -> 20
    assert lim.admit_now("k", 2, None) == Refusal("requests", 2, 20)
    assert lim.used("k") == (2, 0)  # refusals are not counted
    now[0] = 1020.0
    assert lim.admit_now("k", 2, None) is None and lim.used("k") == (1, 0)
    assert lim.used("k", 16) == (2, 0)
    assert lim.admit_now("other", 2, None) is None  # per key


def test_tpm_admits_while_under_and_charges_the_estimate() -> None:
    """tpm 100: a request with estimate 60 (used 0 < 100) is admitted and charged; one more
    (60 < 100) too, taking the key to 120; the next is refused (120 >= 100)."""
    lim = MemoryLimiter(clock=lambda: 0.0)
    assert lim.admit_now("k", None, 100, tokens=60) is None
    assert lim.used("k") == (1, 60)
    assert lim.admit_now("k", None, 100, tokens=60) is None
    assert lim.admit_now("k", None, 100, tokens=1) == Refusal("tokens", 100, 60)
    assert lim.used("k") == (2, 120)


def test_pending_is_added_first_whatever_the_verdict() -> None:
    lim = MemoryLimiter(clock=lambda: 0.0)
    assert lim.admit_now("k", None, 100, tokens=10, pending=100) == Refusal("tokens", 100, 60)
    assert lim.used("k") == (0, 100)  # pending counted though refused
    lim2 = MemoryLimiter(clock=lambda: 0.0)
    assert lim2.admit_now("k", None, 100, tokens=10, pending=99) is None  # 99 < 100
    assert lim2.used("k") == (1, 109)
    assert lim2.admit_now("k", 5, None, pending=7) is None and lim2.used("k") == (2, 116)
    lim3 = MemoryLimiter(clock=lambda: 0.0)
    lim3.admit_now("k", 1, None)
    assert lim3.admit_now("k", 1, None, tokens=50, pending=30) == Refusal("requests", 1, 60)
    assert lim3.used("k") == (1, 30)  # the pending tokens stay counted, the refused estimate not


def test_requests_are_checked_before_tokens() -> None:
    lim = MemoryLimiter(clock=lambda: 0.0)
    lim.admit_now("k", 1, 10, tokens=50)
    assert lim.admit_now("k", 1, 10) == Refusal("requests", 1, 60)


def test_add_tokens_floors_at_zero_and_skips_forgotten_windows() -> None:
    now = [0.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    lim.add_tokens("k", 40)
    assert lim.used("k") == (0, 40)  # the current window is made when missing
    lim.add_tokens("k", -100)
    assert lim.used("k") == (0, 0)
    lim.add_tokens("k", 0)
    assert ("k", 0) in lim._counts
    lim.add_tokens("new", 0)
    assert ("new", 0) not in lim._counts  # zero tokens: nothing made
    now[0] = 60.0
    lim.add_tokens("k", 5, window=0)  # the previous window is still kept
    assert lim.used("k", 0) == (0, 5)
    lim.add_tokens("k", 5, window=7)  # a window never made: nothing
    assert lim.used("k", 7) == (0, 0) and ("k", 7) not in lim._counts
    now[0] = 180.0  # window 3: window 0 is older than the previous one -> forgotten
    lim.add_tokens("k", 5, window=0)
    assert lim.used("k", 0) == (0, 0) and ("k", 0) not in lim._counts


def test_old_windows_are_pruned_and_the_previous_one_kept() -> None:
    now = [0.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    lim.admit_now("a", None, None)
    now[0] = 60.0
    lim.admit_now("b", None, None)
    assert set(lim._counts) == {("a", 0), ("b", 1)}
    now[0] = 120.0
    lim.admit_now("c", None, None)
    assert set(lim._counts) == {("b", 1), ("c", 2)}
    assert lim.window() == 2


def test_admit_is_admit_now() -> None:
    lim = MemoryLimiter(clock=lambda: 0.0)
    assert asyncio.run(lim.admit("k", 1, None)) is None
    assert asyncio.run(lim.admit("k", 1, None, tokens=3, pending=2)) == Refusal("requests", 1, 60)
    assert lim.used("k") == (1, 2)


class FakeRedis:
    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, []

    async def eval(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.answer


class FakeLink:
    def __init__(self, redis: FakeRedis | None) -> None:
        self.redis, self.prefix = redis, "p:"

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def run(self, op: Any, fallback: Any) -> Any:
        return fallback if self.redis is None else await op(self.redis)


def test_redis_admit_sends_its_arguments_and_reads_the_verdict() -> None:
    r = FakeRedis([0, 1, 10])
    lim = RedisLimiter(FakeLink(r), clock=lambda: 961.2)  # type: ignore[arg-type]
    assert asyncio.run(lim.admit("k", None, 500, tokens=10, pending=3)) is None
    script, nkeys, req, tok, rpm, tpm, tokens, pending, ttl = r.calls[0]
    assert (nkeys, req, tok) == (2, "p:rl:k:16:req", "p:rl:k:16:tok")
    assert (rpm, tpm, tokens, pending, ttl) == (-1, 500, 10, 3, 2 * WINDOW_S)
    assert script == rl._ADMIT_LUA
    r.answer = [1, 5, 0]
    assert asyncio.run(lim.admit("k", 5, None)) == Refusal("requests", 5, 59)
    assert r.calls[-1][4:6] == (5, -1)
    r.answer = [2, 1, 900]
    assert asyncio.run(lim.admit("k", 5, 800)) == Refusal("tokens", 800, 59)
    assert lim.keys("k", 3) == ("p:rl:k:3:req", "p:rl:k:3:tok") and lim.window() == 16


def test_redis_down_falls_back_to_the_local_counters() -> None:
    lim = RedisLimiter(FakeLink(None), clock=lambda: 0.0)  # type: ignore[arg-type]
    assert asyncio.run(lim.admit("k", 1, None, tokens=4)) is None
    assert asyncio.run(lim.admit("k", 1, None)) == Refusal("requests", 1, 60)
    assert lim.local.used("k") == (1, 4)

    async def add() -> None:
        lim.add_tokens("k", 6)
        lim.add_tokens("k", 0)
        await lim.drain()

    asyncio.run(add())
    assert lim.local.used("k") == (1, 10)


def test_redis_add_tokens_writes_in_the_background_to_its_window() -> None:
    r = FakeRedis(5)
    lim = RedisLimiter(FakeLink(r), clock=lambda: 125.0)  # type: ignore[arg-type]

    async def add() -> None:
        lim.add_tokens("k", 7)
        lim.add_tokens("k", -2, window=1)
        lim.add_tokens("k", 0)
        assert len(lim._tasks) == 2
        await lim.drain()

    asyncio.run(add())
    assert [c[1:] for c in r.calls] == [(1, "p:rl:k:2:tok", 7, 120), (1, "p:rl:k:1:tok", -2, 120)]
    assert r.calls[0][0] == rl._ADD_LUA and not lim._tasks
    lim.add_tokens("k", 3)  # no event loop: dropped with a warning, never raises
    assert len(r.calls) == 2


def test_ticket_arithmetic() -> None:
    t = Ticket("k", 0, estimate=100)
    assert t.charged == 100 and t.unseen() == 0 and t.pending() == 0
    seen = [30]
    t.progress = lambda: seen[0]
    assert t.unseen() == 30
    assert t.pending() == 30 and t.output == 30 and t.charged == 130
    assert t.pending() == 0
    seen[0] = 25  # a progress that went back: nothing negative
    assert t.unseen() == 0
    seen[0] = 50
    t.settled = True
    assert t.pending() == 0 and t.output == 30

    def broken() -> int:
        raise RuntimeError

    t.progress = broken
    assert t.unseen() == 0


def test_estimate_is_json_text_over_four_rounded_up() -> None:
    """{"a":"xyz"} is 12 characters of JSON text ("a" key, space after the colon): 12 / 4 = 3;
    13 characters -> 4. Unserializable: the byte size / 4, rounded up."""
    assert estimate_now({"a": "xyz"}, 0) == 3
    assert estimate_now({"a": "xyza"}, 0) == 4
    assert rl._quarter("") == 0 and rl._quarter("abcde") == 2
    assert estimate_now({"a": object()}, 9) == 3
    assert asyncio.run(prompt_estimate({"a": "xyz"}, 10)) == 3


def test_a_large_body_is_estimated_off_the_loop_with_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    async def run_sync(fn: Any, *a: Any) -> Any:
        calls.append(fn)
        return fn(*a)

    monkeypatch.setattr(rl.anyio.to_thread, "run_sync", run_sync)
    assert asyncio.run(prompt_estimate({"a": "xyz"}, rl.OFF_LOOP_BYTES + 1)) == 3
    assert calls == [estimate_now]
    assert asyncio.run(prompt_estimate({"a": "xyz"}, rl.OFF_LOOP_BYTES)) == 3 and len(calls) == 1


def test_an_unserializable_body_is_estimated_from_its_size_on_both_paths(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte-size fallback gets the size it was given, on and off the loop."""
    assert asyncio.run(prompt_estimate({"a": object()}, 10)) == 3

    async def run_sync(fn: Any, *a: Any) -> Any:
        return fn(*a)

    monkeypatch.setattr(rl.anyio.to_thread, "run_sync", run_sync)
    big = rl.OFF_LOOP_BYTES + 1
    assert asyncio.run(prompt_estimate({"a": object()}, big)) == (big + 3) // 4


def test_tokens_for_a_window_never_counted_go_nowhere() -> None:
    """A window with no counter (never admitted in, or forgotten): the tokens are dropped, not
    moved to the current window."""
    now = [130.0]
    lim = MemoryLimiter(lambda: now[0])
    lim.add_tokens("k", 50, window=1)  # the previous window, no counter for k
    lim.add_tokens("k", 50, window=9)  # a future one
    assert lim.used("k") == (0, 0) and lim.used("k", 1) == (0, 0)
    lim.add_tokens("k", 5, window=2)  # the current window by number: created
    assert lim.used("k") == (0, 5)


def test_redis_limiter_keeps_the_local_limiter_it_is_given() -> None:
    local = MemoryLimiter(lambda: 0.0)
    assert RedisLimiter(FakeLink(None), local, clock=lambda: 0.0).local is local  # type: ignore[arg-type]
    own = RedisLimiter(FakeLink(None), clock=lambda: 0.0).local  # type: ignore[arg-type]
    assert isinstance(own, MemoryLimiter) and own is not local


def test_redis_down_admits_on_the_local_tpm_with_pending() -> None:
    lim = RedisLimiter(FakeLink(None), clock=lambda: 0.0)  # type: ignore[arg-type]
    assert asyncio.run(lim.admit("k", None, 10, tokens=4, pending=3)) is None
    assert lim.local.used("k") == (1, 7)
    assert asyncio.run(lim.admit("k", None, 10, pending=3)) == Refusal("tokens", 10, 60)
    assert lim.local.used("k") == (1, 10)


def test_redis_down_adds_tokens_to_the_window_named() -> None:
    now = [30.0]
    lim = RedisLimiter(FakeLink(None), clock=lambda: now[0])  # type: ignore[arg-type]
    asyncio.run(lim.admit("k", None, None, tokens=4))  # window 0
    now[0] = 70.0  # window 1

    async def add() -> None:
        lim.add_tokens("k", 6, window=0)
        await lim.drain()

    asyncio.run(add())
    assert lim.local.used("k", 0) == (1, 10) and lim.local.used("k", 1) == (0, 0)


def test_no_event_loop_logs_the_dropped_write(caplog: pytest.LogCaptureFixture) -> None:
    lim = RedisLimiter(FakeLink(FakeRedis(5)), clock=lambda: 0.0)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="prefixgate.ratelimit"):
        lim.add_tokens("k", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "rate limiter: no event loop; tokens not written to Redis"]
