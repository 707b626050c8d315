"""The circuit breaker, pinned point by point (issue 21): hand-computed cases for each rule of
:mod:`prefixgate.proxy.routing.breaker`'s docstring and :class:`BreakerSettings`, and a
hypothesis state machine against a tiny reference model — one replica, then two replicas linked
through :class:`prefixgate.proxy.routing.shared.SharedRouting` on one ``LocalState`` standing for
the shared store (routing/shared.py's docstring: an opening is published and applied by the
peer; a half-open peer is left alone; a peer's probe success closes an open breaker).

Times are whole seconds on an injected clock, so window and cooldown edges are hit exactly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from prefixgate.cache.state.shared_state import LocalState
from prefixgate.config.routing import BreakerSettings
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerBoard
from prefixgate.proxy.routing.shared import SharedRouting


def _breaker(**kw: object) -> tuple[Breaker, list[float]]:
    now = [0.0]
    return Breaker(BreakerSettings(**kw), now=lambda: now[0]), now


# ---- hand-computed cases, one per rule point ----------------------------------------------------

def test_the_error_rate_rule_needs_min_requests_outcomes() -> None:
    """Rate rule: at least ``min_requests`` outcomes AND a failure share >= ``error_rate``.
    One failure out of one outcome is a share of 1.0 but below min_requests=4: stays closed."""
    b, _ = _breaker(consecutive_failures=100, min_requests=4, error_rate=0.5)
    b.failure("status-503")
    assert b.state == CLOSED


def test_the_error_rate_counts_failures_once_each_not_successes() -> None:
    """4 outcomes, 1 failure (share 0.25 < 0.5): closed; a 2nd failure in the next 4 (2 of 5,
    0.4): closed; a 3rd (3 of 6 = 0.5 >= 0.5): open."""
    b, _ = _breaker(consecutive_failures=100, min_requests=4, error_rate=0.5)
    for ok in (True, True, True):
        b.success()
    b.failure("status-503")
    assert b.state == CLOSED  # 1 of 4
    b.failure("status-503")
    assert b.state == CLOSED  # 2 of 5
    b.failure("status-503")
    assert b.state == OPEN and b.last_reason == "status-503"  # 3 of 6


def test_a_success_is_a_good_outcome_in_the_window() -> None:
    """Successes count in the share's denominator as good outcomes: 2 failures among 8 outcomes
    (0.25) stay closed with error_rate 0.3; had the 6 successes counted as failures it would
    open."""
    b, _ = _breaker(consecutive_failures=100, min_requests=8, error_rate=0.3)
    for _ in range(6):
        b.success()
    b.failure("x")
    b.failure("x")
    assert b.state == CLOSED and len(b.outcomes) == 8


def test_an_outcome_exactly_window_s_old_still_counts() -> None:
    """The window keeps outcomes of the last ``window_s`` seconds, its edge included: a failure
    at t=0 and one at t=10 (window 10) are 2 outcomes, both bad: open (min_requests=2, rate 1)."""
    b, now = _breaker(consecutive_failures=100, min_requests=2, error_rate=1.0, window_s=10.0)
    b.failure("a")
    now[0] = 10.0
    b.failure("b")
    assert b.state == OPEN
    b2, now2 = _breaker(consecutive_failures=100, min_requests=2, error_rate=1.0, window_s=10.0)
    b2.failure("a")
    now2[0] = 10.5  # past the edge: the first outcome is dropped
    b2.failure("b")
    assert b2.state == CLOSED and len(b2.outcomes) == 1


def test_a_disabled_breaker_never_opens() -> None:
    """``enabled: false``: never open, whatever the failures (consecutive or rate)."""
    b, _ = _breaker(enabled=False, consecutive_failures=1, min_requests=1, error_rate=0.1)
    for _ in range(5):
        b.failure("connect")
    assert b.state == CLOSED and b.available()
    b.open_from_peer("peer", 0.0)
    assert b.state == CLOSED


def test_the_cooldown_is_measured_from_the_opening() -> None:
    """Open at t=100 (cooldown 30): a send at t=101 does not make it half-open; at t=130 it does."""
    b, now = _breaker(consecutive_failures=1, cooldown_s=30.0)
    now[0] = 100.0
    b.failure("connect")
    assert b.state == OPEN and b.opened_at == 100.0 and not b.probing
    now[0] = 101.0
    b.before_send()
    assert b.state == OPEN and not b.available()
    now[0] = 130.0
    assert b.available()
    b.before_send()
    assert b.state == HALF_OPEN and b.probing and not b.available()
    b.abandoned()
    assert b.probing is False and b.available()


def test_a_probe_success_closes_and_clears_the_reason() -> None:
    b, now = _breaker(consecutive_failures=1, cooldown_s=5.0)
    b.failure("status-503")
    now[0] = 5.0
    b.before_send()
    b.success()
    assert (b.state, b.probing, b.last_reason, b.consecutive) == (CLOSED, False, "", 0)


def test_a_failure_records_its_reason() -> None:
    b, _ = _breaker(consecutive_failures=2)
    b.failure("status-502")
    assert b.last_reason == "status-502" and b.state == CLOSED
    board = BreakerBoard(BreakerSettings(consecutive_failures=1))
    board.get("d1").failure("connect")
    assert board.down() == {"d1": "open: connect"}


def test_open_from_peer_keeps_the_rest_of_the_peer_cooldown() -> None:
    """A peer opened ``age_s`` ago: opened_at = now - age (never in the future: a negative age
    counts as 0)."""
    b, now = _breaker(cooldown_s=30.0)
    now[0] = 50.0
    b.open_from_peer("peer", 10.0)
    assert (b.state, b.opened_at, b.last_reason, b.probing) == (OPEN, 40.0, "peer", False)
    b2, now2 = _breaker(cooldown_s=30.0)
    now2[0] = 50.0
    b2.open_from_peer("peer", 0.0)
    assert b2.opened_at == 50.0
    b3, now3 = _breaker(cooldown_s=30.0)
    now3[0] = 50.0
    b3.open_from_peer("peer", -5.0)
    assert b3.opened_at == 50.0


def test_open_from_peer_leaves_half_open_alone_and_takes_only_a_newer_opening() -> None:
    b, now = _breaker(consecutive_failures=1, cooldown_s=10.0)
    b.failure("mine")  # open at 0
    now[0] = 5.0
    b.open_from_peer("same time", 5.0)  # opened at 0 too: not newer, nothing changes
    assert (b.opened_at, b.last_reason) == (0.0, "mine")
    b.open_from_peer("older", 7.0)  # opened at -2: older
    assert (b.opened_at, b.last_reason) == (0.0, "mine")
    b.open_from_peer("newer", 1.0)  # opened at 4: newer, taken
    assert (b.opened_at, b.last_reason) == (4.0, "newer")
    now[0] = 14.0
    b.before_send()
    assert b.state == HALF_OPEN
    b.open_from_peer("peer", 0.0)  # half-open: its probe decides
    assert (b.state, b.probing, b.last_reason) == (HALF_OPEN, True, "newer")


def test_close_from_peer_closes_only_an_open_breaker_and_resets_the_streak() -> None:
    b, now = _breaker(consecutive_failures=2, cooldown_s=10.0)
    b.failure("x")
    b.failure("x")
    assert b.state == OPEN
    b.close_from_peer()
    assert (b.state, b.consecutive, b.last_reason) == (CLOSED, 0, "")
    b.failure("y")
    assert b.state == CLOSED  # 1 in a row again, not 2
    b.failure("y")
    now[0] = 10.0
    b.before_send()
    b.close_from_peer()  # half-open: waits for its own probe
    assert b.state == HALF_OPEN


# ---- the state machine: one breaker against a reference model ------------------------------------

@dataclass
class Model:
    """The breaker as its docstring states it, written independently of the module."""

    s: BreakerSettings
    state: str = CLOSED
    streak: int = 0
    opened_at: float = 0.0
    probing: bool = False
    reason: str = ""
    outcomes: list[tuple[float, bool]] = field(default_factory=list)

    def note(self, t: float, ok: bool) -> None:
        self.outcomes = [(u, o) for u, o in self.outcomes + [(t, ok)] if u >= t - self.s.window_s]

    def tripped(self) -> bool:
        n = len(self.outcomes)
        bad = len([o for _, o in self.outcomes if not o])
        return self.s.enabled and (self.streak >= self.s.consecutive_failures
                                   or (n >= self.s.min_requests and bad >= self.s.error_rate * n))

    def cooled(self, t: float) -> bool:
        return t - self.opened_at >= self.s.cooldown_s

    def available(self, t: float) -> bool:
        if not self.s.enabled or self.state == CLOSED:
            return True
        return self.cooled(t) if self.state == OPEN else not self.probing

    def before_send(self, t: float) -> None:
        if self.state == OPEN and self.cooled(t):
            self.state = HALF_OPEN
        if self.state == HALF_OPEN:
            self.probing = True

    def success(self, t: float) -> None:
        self.note(t, True)
        self.streak = 0
        if self.state != CLOSED:
            self.state, self.probing, self.reason = CLOSED, False, ""

    def failure(self, t: float, reason: str) -> None:
        self.note(t, False)
        self.streak += 1
        self.reason = reason
        if self.state == HALF_OPEN or self.tripped():
            self.state, self.opened_at, self.probing = OPEN, t, False

    def open_from_peer(self, t: float, reason: str, age: float) -> None:
        at = t - max(0.0, age)
        if self.s.enabled and (self.state == CLOSED or (self.state == OPEN and at > self.opened_at)):
            self.state, self.opened_at, self.probing, self.reason = OPEN, at, False, reason

    def close_from_peer(self) -> None:
        if self.state == OPEN:
            self.state, self.streak, self.reason = CLOSED, 0, ""


SETTINGS = st.sampled_from([
    BreakerSettings(consecutive_failures=2, min_requests=100, window_s=5.0, cooldown_s=4.0),
    BreakerSettings(consecutive_failures=100, min_requests=3, error_rate=0.5, window_s=4.0, cooldown_s=3.0),
    BreakerSettings(consecutive_failures=3, min_requests=4, error_rate=0.75, window_s=3.0, cooldown_s=2.0),
    BreakerSettings(enabled=False, consecutive_failures=1, min_requests=1, error_rate=0.1),
])
REASONS = st.sampled_from(["status-503", "connect", "timeout"])


class OneBreaker(RuleBasedStateMachine):
    """Every operation on a :class:`Breaker` and on the model; every field compared after each."""

    def __init__(self) -> None:
        super().__init__()
        self.t = [0.0]
        self.b: Breaker | None = None
        self.m: Model | None = None

    @rule(s=SETTINGS)
    def start(self, s: BreakerSettings) -> None:
        if self.b is None:
            self.b, self.m = Breaker(s, now=lambda: self.t[0]), Model(s)

    @rule(dt=st.integers(0, 6))
    def tick(self, dt: int) -> None:
        self.t[0] += dt

    @rule()
    def send(self) -> None:
        if self.b and self.m:
            assert self.b.available() == self.m.available(self.t[0])
            self.b.before_send()
            self.m.before_send(self.t[0])

    @rule()
    def abandon(self) -> None:
        if self.b and self.m:
            self.b.abandoned()
            self.m.probing = False

    @rule()
    def ok(self) -> None:
        if self.b and self.m:
            self.b.success()
            self.m.success(self.t[0])

    @rule(reason=REASONS)
    def fail(self, reason: str) -> None:
        if self.b and self.m:
            self.b.failure(reason)
            self.m.failure(self.t[0], reason)

    @rule(age=st.integers(-2, 6))
    def peer_opens(self, age: int) -> None:
        if self.b and self.m:
            self.b.open_from_peer("peer", float(age))
            self.m.open_from_peer(self.t[0], "peer", float(age))

    @rule()
    def peer_closes(self) -> None:
        if self.b and self.m:
            self.b.close_from_peer()
            self.m.close_from_peer()

    @invariant()
    def same_as_the_model(self) -> None:
        if not (self.b and self.m):
            return
        b, m = self.b, self.m
        assert (b.state, b.consecutive, b.last_reason, b.probing) == (m.state, m.streak, m.reason, m.probing)
        assert [ok for _, ok in b.outcomes] == [ok for _, ok in m.outcomes]
        assert b.available() == m.available(self.t[0])
        if b.state == OPEN:
            assert b.opened_at == m.opened_at
        assert not b.probing or b.state == HALF_OPEN  # no probe in flight unless half-open


OneBreaker.TestCase.settings = settings(max_examples=300, stateful_step_count=30)
test_one_breaker_follows_the_model = OneBreaker.TestCase


# ---- two replicas through SharedRouting on one fake shared store ---------------------------------

TWO = BreakerSettings(consecutive_failures=2, min_requests=100, window_s=5.0, cooldown_s=4.0)


class TwoReplicas(RuleBasedStateMachine):
    """Replicas ``a`` and ``b`` each with their breaker of one deployment, linked through one
    LocalState. Held: a breaker opened on one replica is open on the other after it reads
    (unless that one is half-open: its probe decides); a half-open breaker is never closed by a
    peer's news; the shared streak opens the breaker on the replica that reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.t = [0.0]
        self.store = LocalState(clock=lambda: self.t[0])
        self.loop = asyncio.new_event_loop()
        self.r = {n: self._replica(n) for n in ("a", "b")}
        self.opening: tuple[float, str] | None = None  # the latest opening published: (t, replica)

    def _replica(self, name: str) -> SharedRouting:
        board = BreakerBoard(TWO, now=lambda: self.t[0])
        return SharedRouting(self.store, board, Balancer(), replica=name, max_age_s=0.0,
                             clock=lambda: 1000.0 + self.t[0])

    def teardown(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    def br(self, n: str) -> Breaker:
        # a real clock moves on between two events: the same value written twice within one
        # millisecond cannot be told apart (the same-ms reopening has its own test below)
        self.t[0] += 0.001
        return self.r[n].board.get("d")

    @rule(dt=st.integers(0, 5))
    def tick(self, dt: int) -> None:
        self.t[0] += dt

    @rule(n=st.sampled_from("ab"))
    def fail(self, n: str) -> None:
        b = self.br(n)
        was = b.state
        b.failure("status-503")
        self.loop.run_until_complete(self.r[n].failed("d", was))
        if was == HALF_OPEN:
            assert b.state == OPEN  # a failed probe opens again
        if was != OPEN and b.state == OPEN:
            self.opening = (self.t[0], n)  # published (shared.py: an opening here is written)

    @rule(n=st.sampled_from("ab"))
    def ok(self, n: str) -> None:
        b = self.br(n)
        was = b.state

        async def go() -> None:
            b.success()
            self.r[n].succeeded("d", was)
            await asyncio.sleep(0)
            await asyncio.sleep(0)

        self.loop.run_until_complete(go())
        assert b.state == CLOSED
        if was != CLOSED:
            self.opening = None  # the closing is published

    @rule(n=st.sampled_from("ab"))
    def send(self, n: str) -> None:
        self.br(n).before_send()

    @rule(n=st.sampled_from("ab"))
    def read(self, n: str) -> None:
        b = self.br(n)
        before = (b.state, b.probing)
        self.loop.run_until_complete(self.r[n].refresh(["d"]))
        if before[0] == HALF_OPEN:
            assert (b.state, b.probing) == before  # its own probe decides
        elif (self.opening is not None and self.opening[1] != n
              and self.t[0] - self.opening[0] < TWO.cooldown_s):
            # the other replica's opening is the latest news, within its cooldown: open here too
            assert b.state == OPEN

    @invariant()
    def probing_only_when_half_open(self) -> None:
        for n in "ab":
            b = self.br(n)
            assert not b.probing or b.state == HALF_OPEN
            assert b.state in (CLOSED, OPEN, HALF_OPEN)


TwoReplicas.TestCase.settings = settings(max_examples=150, stateful_step_count=25)
test_two_replicas_share_the_breaker = TwoReplicas.TestCase


def test_a_reopening_in_the_same_millisecond_as_the_closing_reaches_the_peer() -> None:
    """a closes (its probe succeeded) and reopens at the same instant; b read the closing in
    between: b should still learn of the reopening."""
    t = [0.0]
    store = LocalState(clock=lambda: t[0])
    loop = asyncio.new_event_loop()
    r = {n: SharedRouting(store, BreakerBoard(TWO, now=lambda: t[0]), Balancer(), replica=n,
                          max_age_s=0.0, clock=lambda: 1000.0 + t[0]) for n in "ab"}
    a = r["a"].board.get("d")

    async def fail() -> None:
        was = a.state
        a.failure("status-503")
        await r["a"].failed("d", was)

    async def go() -> None:
        await fail()
        await fail()  # open, published
        a.success()
        r["a"].succeeded("d", OPEN)  # closed, published
        await asyncio.sleep(0)
        await fail()
        await r["b"].refresh(["d"])  # b sees the closing
        await fail()  # a opens again, same instant
        await r["b"].refresh(["d"])

    try:
        loop.run_until_complete(go())
    finally:
        loop.close()
    assert a.state == OPEN
    assert r["b"].board.get("d").state == OPEN


@given(st.lists(st.booleans(), max_size=30))
def test_consecutive_counts_failures_since_the_last_success(outcomes: list[bool]) -> None:
    """``consecutive`` is the number of failures after the last success (consecutive-5xx)."""
    b, _ = _breaker(consecutive_failures=1000, min_requests=1000)
    for ok in outcomes:
        b.success() if ok else b.failure("x")
    tail = len(outcomes) - (max(i for i, ok in enumerate(outcomes) if ok) + 1 if any(outcomes) else 0)
    assert b.consecutive == tail
