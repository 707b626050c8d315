"""Which endings give a request's prompt estimate back, over every status class a request can end
with (issue 38 item 10: a request that timed out (408) or whose client left (499) without usage
got its estimate refunded, so a client could dodge its tpm by leaving; the tests covered 400
refunds and 5xx charges only).

The rule (``prefixgate/proxy/http/auth.py``, ``Guard.settle``): a request the backend or the proxy
*refused* (4xx other than 408 / 499) without usage spent nothing and gets its estimate back; any
other ending without usage is charged its estimate plus the output tokens seen. The dimension
varied: the final status (each 4xx the proxy or a backend sends, 408, 499, 5xx, 2xx) x whether
output was streamed before the end x whether usage was reported.
"""

from __future__ import annotations

import asyncio

import pytest

from prefixgate.proxy.http.ratelimit import MemoryLimiter
from tests.adversarial.test_tpm_charges_what_is_spent import Clock, _body, _guard

REFUSED = [400, 401, 403, 404, 409, 413, 415, 422, 429]
CHARGED = [408, 499, 500, 502, 503, 504, 200]


def _settled(status: int, streamed: int, usage: tuple[int, int] | None) -> tuple[int, int]:
    """(estimate, tokens used after settling) for one request ending with ``status``."""
    async def run() -> tuple[int, int]:
        g = _guard(Clock(9_000.0))
        lim = g.limiter
        assert isinstance(lim, MemoryLimiter)
        t = await g.limit("k_g", _body("word " * 400), 0)
        assert t is not None
        t.progress = lambda: streamed
        p, o = usage if usage is not None else (None, None)
        g.settle(t, p, o, status)
        return t.estimate, lim.used("k_g")[1]

    return asyncio.run(run())


@pytest.mark.parametrize("status", REFUSED)
def test_a_refused_request_without_usage_gets_its_estimate_back(status: int) -> None:
    estimate, used = _settled(status, 0, None)
    assert estimate > 0 and used == 0


@pytest.mark.parametrize("status", CHARGED)
@pytest.mark.parametrize("streamed", [0, 7])
def test_a_timed_out_abandoned_or_failed_request_is_charged_its_estimate(status: int,
                                                                          streamed: int) -> None:
    estimate, used = _settled(status, streamed, None)
    assert used == estimate + streamed  # leaving (499) or timing out (408) dodges nothing


@pytest.mark.parametrize("status", [*REFUSED, *CHARGED])
def test_reported_usage_is_charged_whatever_the_status(status: int) -> None:
    _, used = _settled(status, 3, (120, 9))
    assert used == 129

