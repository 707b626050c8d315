"""The trials' daily budget (prefixgate/cache/guard/budget.py): many reservations at once never
take a route past any of its three limits, a refused one holds nothing, settling gives back what
a trial did not use, and each UTC day starts empty."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from prefixgate.cache.guard.budget import BudgetBook, Reservation, TrialBudget
from prefixgate.cache.state.shared_state import LocalState, RedisState
from tests.guard.conftest import Clock, Yielding

# one trial: 1 request, 100 tokens, $0.01; each budget below lets exactly one limit bind
BINDING = {
    "requests": (TrialBudget(30, 1_000_000, 100.0), 30),
    "tokens": (TrialBudget(1000, 2500, 100.0), 25),
    "usd": (TrialBudget(1000, 1_000_000, 0.2), 20),
}


async def reserve_many(book: BudgetBook, budget: TrialBudget, n: int) -> list[Reservation]:
    got = await asyncio.gather(*(book.reserve("r", budget, 1, 100, 0.01, priced=True) for _ in range(n)))
    return [r for r in got if r is not None]


@pytest.mark.parametrize("limit", list(BINDING))
async def test_concurrent_reservations_never_pass_a_limit(limit: str, local: LocalState,
                                                         clock: Clock) -> None:
    budget, most = BINDING[limit]
    book = BudgetBook(Yielding(local), clock=clock)
    ok = await reserve_many(book, budget, 100)
    spent = await book.spent("r")
    assert 1 <= len(ok) <= most
    assert spent == {"requests": len(ok), "tokens": 100 * len(ok), "usd": pytest.approx(0.01 * len(ok))}
    assert spent["requests"] <= budget.requests_per_day and spent["tokens"] <= budget.tokens_per_day
    assert spent["usd"] <= budget.usd_per_day + 1e-9


@pytest.mark.parametrize("limit", list(BINDING))
async def test_one_at_a_time_a_budget_is_used_to_its_limit(limit: str, local: LocalState,
                                                          clock: Clock) -> None:
    budget, most = BINDING[limit]
    book = BudgetBook(local, clock=clock)
    got = [await book.reserve("r", budget, 1, 100, 0.01, priced=True) for _ in range(most + 5)]
    assert [r is not None for r in got] == [True] * most + [False] * 5
    assert (await book.spent("r"))["requests"] == most  # the refused ones hold nothing


async def test_a_refused_reservation_takes_back_what_it_counted(local: LocalState, clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    budget = TrialBudget(10, 1000, 1.0)
    assert await book.reserve("r", budget, 1, 5000, 0.01, priced=True) is None  # tokens
    assert await book.reserve("r", budget, 1, 100, 5.0, priced=True) is None  # usd
    assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}


async def test_zero_budgets_and_unpriced_routes(local: LocalState, clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    assert await book.reserve("r", TrialBudget(0, 10**6, 10.0), 1, 1, 0.0, priced=False) is None
    assert await book.reserve("r", TrialBudget(10, 10**6, 0.0), 1, 1, 0.01, priced=True) is None
    assert await book.reserve("r", TrialBudget(10, 0, 10.0), 1, 1, 0.0, priced=False) is None
    r = await book.reserve("local", TrialBudget(10, 10**6, 0.0), 1, 100, 3.0, priced=False)
    assert r is not None and r.usd_micros == 0  # usd neither checked nor counted
    assert (await book.spent("local"))["usd"] == 0
    with pytest.raises(ValueError):
        await book.reserve("r", TrialBudget(10, 10, 1.0), 1, -1, 0.0, priced=False)


async def test_settling_gives_back_what_the_trial_did_not_use(local: LocalState, clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    budget = TrialBudget(10, 250, 0.03)
    r = await book.reserve("r", budget, 1, 100, 0.01, priced=True)
    r2 = await book.reserve("r", budget, 1, 100, 0.01, priced=True)
    assert r is not None and r2 is not None
    assert await book.reserve("r", budget, 1, 100, 0.01, priced=True) is None  # 300 > 250 tokens
    await book.settle(r, tokens=30, usd=0.004)
    assert await book.spent("r") == {"requests": 2, "tokens": 130, "usd": pytest.approx(0.014)}
    assert await book.reserve("r", budget, 1, 100, 0.01, priced=True) is not None


async def test_each_utc_day_starts_empty(local: LocalState, clock: Clock) -> None:
    clock.now = 1_800_057_599.0  # 2027-01-15 23:59:59 UTC
    book = BudgetBook(local, clock=clock)
    r = await book.reserve("r", TrialBudget(1, 100, 0.0), 1, 100, 0.0, priced=False)
    assert r is not None and r.day == "2027-01-15"
    assert await book.reserve("r", TrialBudget(1, 100, 0.0), 1, 100, 0.0, priced=False) is None
    clock.now += 1
    assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}
    assert await book.reserve("r", TrialBudget(1, 100, 0.0), 1, 100, 0.0, priced=False) is not None
    await book.settle(r, tokens=0, usd=0.0)  # settles yesterday's counters, not today's
    assert (await book.spent("r"))["tokens"] == 100


@pytest.mark.parametrize("limit", list(BINDING))
async def test_two_replicas_never_pass_a_limit_through_redis(limit: str, redis_states: Sequence[RedisState],
                                                            clock: Clock) -> None:
    budget, most = BINDING[limit]
    a, b = (BudgetBook(s, clock=clock) for s in redis_states)
    got = await asyncio.gather(reserve_many(a, budget, 60), reserve_many(b, budget, 60))
    n = len(got[0]) + len(got[1])
    assert 1 <= n <= most
    assert await a.spent("r") == await b.spent("r") == {
        "requests": n, "tokens": 100 * n, "usd": pytest.approx(0.01 * n)}
    assert [s.link.outages for s in redis_states] == [0, 0]  # counted in Redis, not locally
