"""A writer whose send fails leaves its prefix cold (issue 38 item 4: a writer whose send *raised*
still marked its prefix warm, so the requests after it were released onto a cold cache; the old
test set the failure flag on the gate's core directly and never went through ``turn``).

The dimension varied: how the writer's send ends (an error raised by the send, a cancelled
request, success as the control) and when the next requests arrive (after the failure, while
its successor writes).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.routing.fanout import FanoutGate

ON = FanoutSettings(enabled=True, max_hold_ms=5000, ttft_factor=2.0, warm_s=300)
BODY = {"model": "m", "system": "s" * 5000, "messages": [{"role": "user", "content": "x"}]}


class SendFailed(Exception):
    pass


async def _writer(gate: FanoutGate, ending: str) -> None:
    """One writer through ``gate.turn`` whose send ends as ``ending`` says."""
    async with gate.turn(BODY, "anthropic", tenant="t"):
        await asyncio.sleep(0.01)
        if ending == "raises":
            raise httpx.ConnectError("upstream refused")
        if ending == "raises_own":
            raise SendFailed("bad gateway")
        if ending == "cancelled":
            raise asyncio.CancelledError


async def _after(gate: FanoutGate, ending: str) -> tuple[int, bool]:
    """The writer ends as ``ending``; then a second request writes (0.2 s to headers) and a
    third arrives 0.05 s into it. Returns (requests held, whether the prefix is warm now)."""
    try:
        await _writer(gate, ending)
    except (httpx.ConnectError, SendFailed, asyncio.CancelledError):
        pass
    warm_after_first = bool(gate.core.warm)

    async def second() -> None:
        async with gate.turn(BODY, "anthropic", tenant="t"):
            await asyncio.sleep(0.2)

    async def third() -> None:
        await asyncio.sleep(0.05)
        async with gate.turn(BODY, "anthropic", tenant="t"):
            pass

    await asyncio.gather(second(), third())
    return gate.held, warm_after_first


@pytest.mark.parametrize("ending", ["raises", "raises_own", "cancelled"])
def test_a_failed_writer_leaves_its_prefix_cold(ending: str) -> None:
    held, warm = asyncio.run(_after(FanoutGate(ON), ending))
    assert not warm  # nothing was written upstream: nobody may be told the prefix is cached
    assert held == 1  # so the next writer is a real writer again and the third waits for it


def test_a_writer_that_answered_warms_its_prefix() -> None:
    held, warm = asyncio.run(_after(FanoutGate(ON), "ok"))
    assert warm and held == 0  # the control: after a good writer the followers go at once
