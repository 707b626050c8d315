"""First-writer gating pinned point by point (issue 21): :mod:`prefixgate.proxy.routing.fanout`.

Source: the module docstring — the first request of a prefix that is not warm is the writer
and goes at once; a request of the same prefix arriving while the writer waits is held until
the writer's headers arrive, the writer fails, or ``min(max_hold_ms, ttft_factor x observed
TTFT)`` passes; a writer that got its headers makes the prefix warm for ``warm_s``; the TTFT is
an EWMA with weight ``EWMA_WEIGHT`` on the newest; at most ``MAX_KEYS`` warm prefixes (oldest
forgotten first); bodies whose shared part is under ``min_prefix_bytes`` are never held; only
backends of ``providers``. Hand-computed values on an explicit clock.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.routing import fanout as fo
from prefixgate.proxy.routing.fanout import EWMA_WEIGHT, FanoutGate, GateCore, fanout_key


def test_fanout_key_hashes_all_but_the_last_message_as_compact_json() -> None:
    body = {"model": "m", "messages": [{"a": 1}, {"b": 2}]}
    key, size = fanout_key(body)
    raw = b'{"model":"m","tools":null,"system":null,"messages":[{"a":1}]}'
    assert size == len(raw) == 61
    import hashlib

    assert key == hashlib.sha256(raw).hexdigest()[:32]
    assert fanout_key({"model": "m", "messages": [{"a": 1}, {"c": 3}]})[0] == key
    assert fanout_key({"model": "m", "messages": [{"a": 2}, {"b": 2}]})[0] != key
    assert fanout_key({"model": "m", "tools": [1], "messages": [{"a": 1}, {"b": 2}]})[0] != key
    assert fanout_key({"model": "m", "system": "s", "messages": [{"a": 1}, {"b": 2}]})[0] != key
    assert fanout_key({"model": "n", "messages": [{"a": 1}, {"b": 2}]})[0] != key
    assert fanout_key({"model": "m", "messages": "x"})[1] == len(b'{"model":"m","tools":null,"system":null,"messages":null}')


def test_hold_budget_is_the_cap_or_factor_times_the_ttft() -> None:
    core = GateCore(FanoutSettings(max_hold_ms=3000, ttft_factor=2.0))
    assert core.hold_budget_s() == 3.0
    core.ttft_ewma_s = 1.0
    assert core.hold_budget_s() == 2.0
    core.ttft_ewma_s = 2.0
    assert core.hold_budget_s() == 3.0


def test_writer_held_warm_by_hand() -> None:
    """warm_s 10: the writer goes (None) and is remembered by its arrival time; a second
    arrival is held until now + budget; answered at t=1.5 (TTFT 1.5): warm until 11.5."""
    s = FanoutSettings(max_hold_ms=5000, ttft_factor=2.0, warm_s=10.0)
    core = GateCore(s)
    assert core.arrive("p", 0.0) is None
    assert core.is_writer("p", 0.0) and not core.is_writer("p", 0.5) and not core.is_writer("q", 0.0)
    assert core.arrive("p", 0.5) == 5.5
    core.answered("p", 1.5, ok=True)
    assert core.ttft_ewma_s == 1.5 and core.warm["p"] == 11.5 and "p" not in core.writers
    assert core.arrive("p", 11.4) is None and "p" not in core.writers  # warm: straight through
    assert core.arrive("p", 11.5) is None and core.writers == {"p": 11.5}  # not warm at its end: a writer
    assert core.arrive("q", 2.0) is None and core.arrive("q", 2.5) == 2.5 + 3.0  # 2 x 1.5


def test_the_ttft_is_an_ewma_weighted_on_the_newest() -> None:
    core = GateCore(FanoutSettings(warm_s=1.0))
    core.arrive("a", 0.0)
    core.answered("a", 1.0, ok=True)
    core.arrive("b", 10.0)
    core.answered("b", 12.0, ok=True)
    assert EWMA_WEIGHT == 0.2
    assert core.ttft_ewma_s == pytest.approx(0.8 * 1.0 + 0.2 * 2.0, rel=1e-12)


def test_a_failed_writer_warms_nothing_and_learns_no_ttft() -> None:
    core = GateCore(FanoutSettings())
    core.arrive("p", 0.0)
    core.answered("p", 3.0, ok=False)
    assert core.ttft_ewma_s is None and "p" not in core.warm and "p" not in core.writers
    core.answered("never", 1.0, ok=True)  # no writer: nothing
    assert core.ttft_ewma_s is None and "never" not in core.warm


def test_at_most_max_keys_warm_prefixes_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fo, "MAX_KEYS", 2)
    core = GateCore(FanoutSettings(warm_s=100.0))
    for i, k in enumerate("abc"):
        core.arrive(k, float(i))
        core.answered(k, float(i) + 0.1, ok=True)
    assert list(core.warm) == ["b", "c"]  # 2 kept: the oldest ("a") forgotten
    core2 = GateCore(FanoutSettings(warm_s=1.0))
    monkeypatch.setattr(fo, "MAX_KEYS", 2)
    for k, t in (("a", 0.0), ("b", 1.0)):
        core2.arrive(k, t)
        core2.answered(k, t + 0.1, ok=True)
    core2.arrive("a", 5.0)  # cooled: a writer again
    core2.answered("a", 5.1, ok=True)  # refreshed: moved to the newest end
    core2.arrive("c", 6.0)
    core2.answered("c", 6.1, ok=True)
    assert list(core2.warm) == ["a", "c"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(fo, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


BODY = {"model": "m", "messages": [{"role": "system", "content": "x" * 100}, {"role": "user", "content": "q"}]}


def gate(**kw: Any) -> FanoutGate:
    return FanoutGate(FanoutSettings(**{"enabled": True, "min_prefix_bytes": 10, **kw}))


def test_a_held_request_goes_when_the_writer_has_its_headers(clock: Clock) -> None:
    g = gate()
    order: list[str] = []

    async def main() -> None:
        release = asyncio.Event()

        async def writer() -> None:
            async with g.turn(BODY):
                order.append("writer sent")
                await release.wait()
                clock.now += 0.5
            order.append("writer answered")

        async def follower() -> None:
            async with g.turn(BODY):
                order.append("follower sent")

        w = asyncio.ensure_future(writer())
        await asyncio.sleep(0)
        f = asyncio.ensure_future(follower())
        await asyncio.sleep(0.01)
        assert order == ["writer sent"] and g.held == 1
        release.set()
        await asyncio.gather(w, f)

    asyncio.run(main())
    assert order == ["writer sent", "writer answered", "follower sent"]
    assert g.core.ttft_ewma_s == 0.5 and g.core.warm[fanout_key(BODY)[0]] == 100.5 + g.settings.warm_s
    assert g._events == {}


def test_a_failing_writer_releases_the_held_and_warms_nothing(clock: Clock) -> None:
    g = gate()
    seen: list[str] = []

    async def main() -> None:
        go = asyncio.Event()

        async def writer() -> None:
            with pytest.raises(RuntimeError):
                async with g.turn(BODY):
                    await go.wait()
                    raise RuntimeError("upstream failed")

        async def follower() -> None:
            async with g.turn(BODY):
                seen.append("follower")

        w = asyncio.ensure_future(writer())
        await asyncio.sleep(0)
        f = asyncio.ensure_future(follower())
        await asyncio.sleep(0.01)
        go.set()
        await asyncio.gather(w, f)

    asyncio.run(main())
    assert seen == ["follower"] and g.core.warm == {} and g.core.ttft_ewma_s is None


def test_a_hold_ends_at_its_deadline(clock: Clock) -> None:
    """max_hold_ms 20: the follower waits at most 0.02 s for a writer that never answers."""
    g = gate(max_hold_ms=20)
    seen: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()

        async def writer() -> None:
            async with g.turn(BODY):
                await stop.wait()

        w = asyncio.ensure_future(writer())
        await asyncio.sleep(0)
        async with g.turn(BODY):
            seen.append("follower went")
        stop.set()
        await w

    asyncio.run(main())
    assert seen == ["follower went"] and g.held == 1


@pytest.mark.parametrize(("kw", "provider", "over", "held"), [
    ({"enabled": False}, "anthropic", -50, 0),
    ({}, "radix", -50, 0),  # not in providers
    ({}, "openai", -50, 1),
    ({}, "anthropic", 0, 1),  # the shared part exactly min_prefix_bytes: gated
    ({}, "anthropic", 1, 0),  # one byte short of it: never held
])
def test_what_is_gated(clock: Clock, kw: dict[str, Any], provider: str, over: int, held: int) -> None:
    """min_prefix_bytes = the body's shared size + ``over``."""
    mpb = fanout_key(BODY)[1] + over
    g = FanoutGate(FanoutSettings(**{"enabled": True, "min_prefix_bytes": mpb, "max_hold_ms": 10, **kw}))

    async def main() -> None:
        stop = asyncio.Event()

        async def writer() -> None:
            async with g.turn(BODY, provider):
                await stop.wait()

        w = asyncio.ensure_future(writer())
        await asyncio.sleep(0)
        async with g.turn(BODY, provider):
            pass
        stop.set()
        await w

    asyncio.run(main())
    assert g.held == held
