"""Requests sent while standing back never count toward the next verdict, whenever they finish
(issue 38 item 6: a long stream sent during a stand-back that finished after the reset was
counted, so the next verdict was taken partly on requests the passes never touched; the old test
only fed such rows while the stand-back still held).

The dimension varied: when the stood-back request finishes (during the stand-back, at its end,
after the reset, long after), how many of them there are, and the tenant they belong to (the
verdict is per route and tenant).
"""

from __future__ import annotations

import pytest

from prefixgate.cache.savings.stand_back import RouteJudge
from tests.cache.test_stand_back import _row

OFF_S = 100.0


def _stood_back_judge(tenant: str = "") -> tuple[RouteJudge, float]:
    """A judge that stood back for ``tenant`` at t=10 (until t=110)."""
    j = RouteJudge(min_requests=4, off_s=OFF_S, every=1)
    for _ in range(4):
        j.observe(_row(1500, 1500, tenant=tenant))      # 40 tokens added, nothing gained
    v = j.verdict("r", 10.0, tenant)
    assert v.stand_back and v.until == 10.0 + OFF_S
    return j, v.until


@pytest.mark.parametrize("finish", ["during", "at_end", "after_reset", "long_after"])
@pytest.mark.parametrize("late", [1, 4, 12])
@pytest.mark.parametrize("tenant", ["", "acme"])
def test_rows_sent_standing_back_never_judge_the_next_verdict(finish: str, late: int,
                                                             tenant: str) -> None:
    j, until = _stood_back_judge(tenant)
    stood = _row(1500, 1500, tenant=tenant, stood_back="hoist_volatile: no better")
    if finish == "during":
        for _ in range(late):
            j.observe(stood)
        assert j.verdict("r", until - 1, tenant).stand_back
    now = until if finish == "at_end" else until + 1
    assert not j.verdict("r", now, tenant).stand_back   # time is up: passes on, windows emptied
    if finish != "during":
        for _ in range(late):  # long streams sent while standing back finish only now
            j.observe(stood)
    later = now + (1000.0 if finish == "long_after" else 1.0)
    # those rows would have made a verdict (they lose 40 tokens each): none is taken from them
    assert not j.verdict("r", later, tenant).stand_back
    for _ in range(3):
        j.observe(_row(1500, 1500, tenant=tenant))      # fresh rewritten requests: 3 < 4
    assert not j.verdict("r", later + 1, tenant).stand_back
    j.observe(_row(1500, 1500, tenant=tenant))          # the 4th fresh one decides again
    assert j.verdict("r", later + 2, tenant).stand_back


def test_another_tenants_late_rows_do_not_judge_this_tenant() -> None:
    j, until = _stood_back_judge("acme")
    assert not j.verdict("r", until + 1, "globex").stand_back
    for _ in range(8):
        j.observe(_row(1500, 1500, tenant="acme", stood_back="x"))
    assert not j.verdict("r", until + 2, "acme").stand_back
    assert not j.verdict("r", until + 2, "globex").stand_back
