"""The trials' daily budget (prefixgate/cache/guard/budget.py): many reservations at once never
take a route past any of its three limits, a refused one holds nothing, settling gives back what
a trial did not use, and each UTC day starts empty."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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


async def test_no_trial_is_reserved_while_shared_redis_is_down(clock: Clock) -> None:
    """Fail closed: a RedisState answering from its own counters (Redis down) would let every
    replica spend the whole budget, so nothing is reserved until Redis is back."""
    from prefixgate.cache.state.redis_link import RedisLink

    dead = RedisState(RedisLink("redis://127.0.0.1:1/0", "test-guard-down:", op_timeout_s=0.5))
    book = BudgetBook(dead, clock=clock)
    budget = TrialBudget(100, 1_000_000, 100.0)
    assert await book.reserve("r", budget, 1, 100, 0.01, priced=True) is None  # goes down here
    assert not dead.link.up
    assert await book.reserve("r", budget, 1, 100, 0.01, priced=True) is None  # already down
    assert await dead.local.count(book._key("r", book._day(), "requests")) == 0  # nothing held


# --- the edges of each rule -----------------------------------------------------------------

DAY = 86400.0
MIDNIGHT = 1_800_057_600.0  # 2027-01-16 00:00:00 UTC
KEY_ROUTE = "openai/gpt-4o:eu"  # a route name with the characters a key must not leave bare
KEY_PREFIX = "guard:b:openai%2Fgpt-4o%3Aeu:"


def raw_key(day: str, field: str) -> str:
    """The documented counter key of :data:`KEY_ROUTE` (``guard:b:<route>:<day>:<field>``, the
    route percent-encoded whole): replicas of two releases side by side must count in the same
    keys, or each would spend the whole budget."""
    return f"{KEY_PREFIX}{day}:{field}"


async def held_raw(state: LocalState, day: str) -> dict[str, int]:
    """What the store holds under :data:`KEY_ROUTE`'s keys for ``day`` (expired: 0)."""
    return {f: await state.count(raw_key(day, f)) for f in ("requests", "tokens", "usd_micros")}


class Ticking:
    """A SharedState whose every operation takes ``step`` seconds of ``clock`` (a round trip)."""

    def __init__(self, inner: LocalState, clock: Clock, step: float = 1.0) -> None:
        self.inner, self.clock, self.step = inner, clock, step

    async def incr(self, name: str, by: int = 1, ttl_s: float | None = None) -> int:
        out = await self.inner.incr(name, by, ttl_s)
        self.clock.now += self.step
        return out

    async def read_many(self, values: Sequence[str], tables: Sequence[str]
                        ) -> tuple[list[str | None], list[dict[str, str]]]:
        out = await self.inner.read_many(values, tables)
        self.clock.now += self.step
        return out


LIMITS = {  # field -> (a budget where only it binds, at 1000 of its unit; a reservation of n units)
    "requests": (TrialBudget(1000, 10**9, 10**6), lambda n: (n, 1, 0.000001)),
    "tokens": (TrialBudget(10**6, 1000, 10**6), lambda n: (1, n, 0.000001)),
    "usd": (TrialBudget(10**6, 10**9, 0.001), lambda n: (1, 1, n / 1_000_000)),
}


@pytest.mark.parametrize("over", [-1, 0, 1])
@pytest.mark.parametrize("limit", list(LIMITS))
async def test_each_limit_admits_exactly_up_to_itself(limit: str, over: int, local: LocalState,
                                                      clock: Clock) -> None:
    budget, amounts = LIMITS[limit]
    book = BudgetBook(local, clock=clock)
    requests, tokens, usd = amounts(1000 + over)
    r = await book.reserve("r", budget, requests, tokens, usd, priced=True)
    if over > 0:
        assert r is None
        assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}
    else:
        assert r == Reservation("r", "2027-01-15", requests, tokens, round(usd * 1_000_000))
        assert await book.spent("r") == {"requests": requests, "tokens": tokens, "usd": usd}


@pytest.mark.parametrize(("budget", "requests", "usd", "priced"), [
    (TrialBudget(0, 10**6, 10.0), 0, 0.01, True),  # requests_per_day 0, priced
    (TrialBudget(0, 10**6, 10.0), 0, 0.0, False),  # requests_per_day 0, unpriced
    (TrialBudget(10, 10**6, 0.0), 1, 0.0, True),  # usd_per_day 0 and a price of $0
])
async def test_a_zero_limit_refuses_even_a_reservation_asking_none_of_it(
        budget: TrialBudget, requests: int, usd: float, priced: bool, local: LocalState,
        clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    assert await book.reserve("r", budget, requests, 100, usd, priced) is None
    assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}


@pytest.mark.parametrize("amounts", [(-1, 10, 0.01), (1, -1, 0.01), (1, 10, -0.000001)])
async def test_a_negative_amount_is_an_error_and_holds_nothing(amounts: tuple[int, int, float],
                                                               local: LocalState, clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    with pytest.raises(ValueError, match=r"^a reservation's amounts must be >= 0$"):
        await book.reserve("r", TrialBudget(10, 1000, 1.0), *amounts, priced=True)
    assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}


@pytest.fixture(params=["AAA+10", "BBB-14"])  # POSIX zones: UTC-10 and UTC+14
def host_zone(request: pytest.FixtureRequest) -> Iterator[None]:
    """The host's local time zone set to ``request.param`` for the test (restored after)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.mark.usefixtures("host_zone")
async def test_the_day_turns_at_utc_midnight_whatever_the_host_zone(local: LocalState,
                                                                    clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    one = TrialBudget(1, 100, 0.0)
    clock.now = MIDNIGHT - 0.001
    r = await book.reserve("r", one, 1, 100, 0.0, priced=False)
    assert r is not None and r.day == "2027-01-15"
    assert await book.reserve("r", one, 1, 100, 0.0, priced=False) is None
    clock.now = MIDNIGHT
    assert await book.spent("r") == {"requests": 0, "tokens": 0, "usd": 0}
    r = await book.reserve("r", one, 1, 100, 0.0, priced=False)
    assert r is not None and r.day == "2027-01-16"


def micros_text(m: int) -> str:
    """``m`` millionths of a dollar as a decimal text (``"1040.644066"``)."""
    return f"{m // 1_000_000}.{m % 1_000_000:06d}"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10 ** 12))
@example(1_040_644_066)  # float(text) * 10**6 is m + 1.2e-7: noise, not a micro
@example(8_461_211_552)  # float(text) * 10**6 is m + 1e-6: rounding to 6 places keeps it
@example(2_115_408_682)
@example(1)
def test_a_usd_limit_given_to_the_micro_is_that_many_micros(m: int) -> None:
    """float noise is neither held nor allowed, to $1,000,000 a day."""
    usd = float(micros_text(m))

    async def run() -> None:
        clock = Clock()
        book = BudgetBook(LocalState(clock=clock), clock=clock)
        budget = TrialBudget(10, 1000, usd)
        r = await book.reserve("r", budget, 1, 1, usd, priced=True)
        if m == 0:  # a zero usd_per_day: no trials
            assert r is None
            return
        assert r is not None and r.usd_micros == m
        assert (await book.spent("r"))["usd"] == usd
        assert await book.reserve("r", budget, 1, 1, 0.000001, priced=True) is None
        assert (await book.spent("r"))["usd"] == usd

    asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1_000_000_000), st.integers(1, 9))
@example(0, 4)
@example(1_000_000, 4)
def test_a_fraction_of_a_micro_dollar_is_held_as_a_whole_one(m: int, tenths: int) -> None:
    usd = float(micros_text(m) + str(tenths))  # m + tenths / 10 micro-dollars

    async def run() -> None:
        clock = Clock()
        book = BudgetBook(LocalState(clock=clock), clock=clock)
        r = await book.reserve("r", TrialBudget(10, 1000, 10_000.0), 1, 1, usd, priced=True)
        assert r is not None and r.usd_micros == m + 1
        assert (await book.spent("r"))["usd"] == (m + 1) / 1_000_000

    asyncio.run(run())


@pytest.mark.parametrize(("tokens", "usd", "left_tokens", "left_micros"), [
    (0, 0.0, 0, 0),  # nothing sent: all given back
    (-5, -0.5, 0, 0),  # a negative report counts as nothing
    (1, 0.000001, 1, 1),
    (999, 0.009999, 999, 9999),  # one under the estimate
    (1000, 0.01, 1000, 10_000),  # exactly the estimate
    (1001, 0.010001, 1001, 10_001),  # one over: charged too
])
async def test_settling_leaves_exactly_the_actual_use(tokens: int, usd: float, left_tokens: int,
                                                      left_micros: int, local: LocalState,
                                                      clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    r = await book.reserve("r", TrialBudget(10, 5000, 1.0), 3, 1000, 0.01, priced=True)
    assert r is not None
    await book.settle(r, tokens, usd)
    assert await book.spent("r") == {"requests": 3, "tokens": left_tokens,
                                     "usd": left_micros / 1_000_000}


@pytest.mark.parametrize("usd", [0.0, 0.25])
async def test_settling_an_unpriced_reservation_never_touches_usd(usd: float, local: LocalState,
                                                                  clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    r = await book.reserve(KEY_ROUTE, TrialBudget(10, 5000, 0.0), 3, 1000, 0.25, priced=False)
    assert r is not None and r.usd_micros == 0
    await book.settle(r, 400, usd)
    assert await book.spent(KEY_ROUTE) == {"requests": 3, "tokens": 400, "usd": 0}


async def test_counters_expire_two_days_after_their_last_change(local: LocalState,
                                                                clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    t0 = clock.now
    r = await book.reserve(KEY_ROUTE, TrialBudget(10, 5000, 1.0), 3, 1000, 0.01, priced=True)
    assert r is not None and r.day == "2027-01-15"
    clock.now = t0 + 3600
    await book.settle(r, 600, 0.004)  # changes tokens and usd_micros, not requests
    clock.now = t0 + 2 * DAY - 0.001
    assert await held_raw(local, r.day) == {"requests": 3, "tokens": 600, "usd_micros": 4000}
    clock.now = t0 + 2 * DAY
    assert await held_raw(local, r.day) == {"requests": 0, "tokens": 600, "usd_micros": 4000}
    clock.now = t0 + 3600 + 2 * DAY - 0.001
    assert await held_raw(local, r.day) == {"requests": 0, "tokens": 600, "usd_micros": 4000}
    clock.now = t0 + 3600 + 2 * DAY
    assert await held_raw(local, r.day) == {"requests": 0, "tokens": 0, "usd_micros": 0}


async def test_a_rollback_is_a_change_that_restarts_the_expiry(local: LocalState,
                                                              clock: Clock) -> None:
    """Each round trip takes 1 s: the refused reservation increments requests at t1 and tokens at
    t1 + 1, and takes them back at t1 + 2 and t1 + 3; the counters then live to t1 + 2 days + 2
    and + 3 (not + 0 and + 1, as they would if the rollback left the expiry where it was)."""
    book = BudgetBook(Ticking(local, clock), clock=clock)
    budget = TrialBudget(10, 1000, 0.0)
    held = await book.reserve(KEY_ROUTE, budget, 1, 600, 0.0, priced=False)
    assert held is not None
    clock.now = t1 = clock.now + 3600
    assert await book.reserve(KEY_ROUTE, budget, 1, 600, 0.0, priced=False) is None  # 1200 tokens
    assert clock.now == t1 + 4
    kept = {"requests": 1, "tokens": 600, "usd_micros": 0}
    clock.now = t1 + 2 * DAY + 1.5
    assert await held_raw(local, held.day) == kept
    clock.now = t1 + 2 * DAY + 2.5
    assert await held_raw(local, held.day) == {**kept, "requests": 0}
    clock.now = t1 + 2 * DAY + 3
    assert await held_raw(local, held.day) == {"requests": 0, "tokens": 0, "usd_micros": 0}


@pytest.mark.parametrize("made", [-1, 0, 1, 2, 3, None])
async def test_settling_gives_back_the_requests_of_the_sends_not_made(made: int | None,
                                                                      local: LocalState,
                                                                      clock: Clock) -> None:
    """``settle``'s ``requests``: the sends made are kept and the rest given back (a trial that
    stopped at a failed or undecided send); None keeps all it held; below zero counts as none.
    A later trial may use what was given back."""
    budget = TrialBudget(requests_per_day=4, tokens_per_day=1000)
    book = BudgetBook(local, clock=clock)
    r = await book.reserve("r", budget, 3, 300, 0.0, False)
    assert r is not None and await book.reserve("r", budget, 3, 300, 0.0, False) is None
    await book.settle(r, 300, 0.0, made)
    kept = 3 if made is None else max(0, made)
    assert await book.spent("r") == {"requests": kept, "tokens": 300, "usd": 0}
    again = await book.reserve("r", budget, 3, 300, 0.0, False)
    assert (again is not None) == (kept + 3 <= budget.requests_per_day)


async def test_requests_given_back_expire_two_days_after_the_give_back(local: LocalState,
                                                                       clock: Clock) -> None:
    book = BudgetBook(local, clock=clock)
    t0 = clock.now
    r = await book.reserve(KEY_ROUTE, TrialBudget(10, 5000), 3, 1000, 0.0, priced=False)
    assert r is not None
    clock.now = t0 + 3600
    await book.settle(r, 1000, 0.0, 1)              # one send made: two requests given back
    clock.now = t0 + 3600 + 2 * DAY - 0.001
    assert (await held_raw(local, r.day))["requests"] == 1
    clock.now = t0 + 3600 + 2 * DAY
    assert (await held_raw(local, r.day))["requests"] == 0
