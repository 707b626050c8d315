"""Retries and fallbacks pinned point by point (issue 21): :mod:`prefixgate.proxy.routing.retries`.

Source of each rule: the module docstring (each deployment tried once while another step
remains, the last one up to ``attempts`` times; a connect error retried after a full-jitter
backoff on the last step only; a reset or a head timeout goes to the next deployment at once; a
status of ``on_status`` retried when its ``retry-after`` is at most ``max_retry_after_s`` or
when there is none on the last step; any other status answered as is; every send counted; the
in-flight count released on every path), ``RetryBudget`` (Envoy's retry budget), the breaker's
part (open ones skipped while another can serve, all tried when all are open). A fake
transport, a stepped clock and a recorded sleep make each number exact.
"""

from __future__ import annotations

import asyncio
import email.utils
from typing import Any

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.config.routing import RetrySettings
from prefixgate.proxy.bridges import bridge_for
from prefixgate.proxy.core.errors import UpstreamTimeout, UpstreamUnavailable
from prefixgate.proxy.routing.balance import Balancer, rendezvous_order
from prefixgate.proxy.routing.breaker import CLOSED, OPEN, BreakerBoard
from prefixgate.proxy.routing.retries import (
    Attempts,
    Picked,
    RetryBudget,
    RetryBudgets,
    Sender,
    Step,
    backoff_s,
    failure_kind,
    retry_after_s,
)
from prefixgate.proxy.routing.router import plan_targets

# ---- the pure parts ------------------------------------------------------------------------------

def test_retry_after_seconds_dates_and_junk() -> None:
    """RFC 9110 10.2.3: delta-seconds or an HTTP date; a negative or past one is 0."""
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert retry_after_s({"retry-after": "1.5"}) == 1.5
    assert retry_after_s({"retry-after": "-2"}) == 0.0
    assert retry_after_s({}) is None
    assert retry_after_s({"retry-after": "soon"}) is None
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    at = email.utils.parsedate_to_datetime(date).timestamp()
    assert retry_after_s({"retry-after": date}, now=at - 10) == 10.0
    assert retry_after_s({"retry-after": date}, now=at + 10) == 0.0
    # without ``now``: the wall clock (a date in 2100 is decades ahead of it)
    far = retry_after_s({"retry-after": "Fri, 01 Jan 2100 00:00:00 GMT"})
    assert far is not None and far > 365 * 86400


def test_backoff_is_full_jitter_doubling_up_to_the_cap() -> None:
    """before retry n: rand() * min(backoff_max_s, backoff_base_s * 2^(n-1))."""
    s = RetrySettings(backoff_base_s=0.1, backoff_max_s=2.0)
    assert [backoff_s(n, s, lambda: 1.0) for n in (1, 2, 3, 5, 6)] == [0.1, 0.2, 0.4, 1.6, 2.0]
    assert backoff_s(2, s, lambda: 0.5) == 0.1
    assert backoff_s(9, s, lambda: 0.25) == 0.5


def test_the_retry_budget_token_bucket() -> None:
    """Starts full at ``burst``; each request earns ``ratio`` (capped at burst); a send after a
    request's first takes 1 token, refused (nothing taken) below one token."""
    b = RetryBudget(ratio=0.5, burst=2.0)
    assert b.tokens == 2.0
    assert b.spend() and b.tokens == 1.0
    assert b.spend() and b.tokens == 0.0  # exactly one token is enough
    assert not b.spend() and b.tokens == 0.0
    b.earn()
    assert b.tokens == 0.5 and not b.spend() and b.tokens == 0.5
    b.earn()
    assert b.tokens == 1.0 and b.spend()
    for _ in range(10):
        b.earn()
    assert b.tokens == 2.0


def test_failure_kind_reads_the_transport_error() -> None:
    def raised(outer: Exception, inner: BaseException | None) -> Exception:
        try:
            try:
                if inner is not None:
                    raise inner
                raise outer
            except BaseException:
                raise outer  # noqa: B904 - the context is what failure_kind reads
        except Exception as e:  # noqa: BLE001
            return e

    assert failure_kind(raised(UpstreamUnavailable("x"), httpx.ConnectError("no"))) == "connect"
    assert failure_kind(raised(UpstreamUnavailable("x"), ConnectionRefusedError())) == "connect"
    assert failure_kind(raised(UpstreamTimeout("x"), httpx.ConnectTimeout("no"))) == "connect"
    assert failure_kind(raised(UpstreamUnavailable("x"), httpx.ReadError("rst"))) == "reset"
    assert failure_kind(raised(UpstreamTimeout("x"), httpx.ReadTimeout("slow"))) == "timeout"
    assert failure_kind(UpstreamUnavailable("plain")) == "reset"
    assert failure_kind(UpstreamTimeout("plain")) == "timeout"


def test_attempts_log_format() -> None:
    a = Attempts()
    a.failed("d0", "status-503")
    a.failed("d1", "connect")
    assert a.reasons == ["d0:status-503", "d1:connect"] and a.count == 0 and a.all_open is False


# ---- the Sender on a fake transport ---------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def setup(n: int, retry: dict[str, Any] | None = None, mode: str = "round_robin",
          breaker: dict[str, Any] | None = None, timeouts: dict[str, Any] | None = None,
          fallback: bool = False) -> tuple[Any, list[Step]]:
    deps = [{"name": f"d{i}", "base_url": f"http://10.0.0.{i + 1}:8000/v1"} for i in range(n)]
    g: dict[str, Any] = {"kind": "openai_compat", "deployments": deps,
                         "affinity": {"mode": mode, "imbalance_abs": 100}}
    if timeouts:
        g["timeouts"] = timeouts
    backends: dict[str, Any] = {"g": g}
    route: dict[str, Any] = {"match": "*", "backend": "g"}
    if fallback:
        backends["f"] = {"kind": "openai_compat", "base_url": "http://10.0.9.9:8000/v1"}
        route["fallbacks"] = ["f"]
    policy = parse_policy({"backends": backends, "routes": [route],
                           "retry": {"backoff_base_s": 0.1, **(retry or {})},
                           "breaker": breaker or {"enabled": False}})
    return policy, [Step(t, bridge_for("openai", "openai"), b"{}") for t in plan_targets(policy, "m", "openai")]


def host(url: str) -> str:
    return url.split("//")[1].split(":")[0]


class Transport:
    """``script``: per host, a list of what its successive sends do (an int status, a
    ``(status, retry-after)`` pair, or an exception to raise); the last entry repeats."""

    def __init__(self, clock: Clock, script: dict[str, list[Any]]) -> None:
        self.clock, self.script, self.sent = clock, script, []
        self.answers: list[httpx.Response] = []

    async def __call__(self, url: str, headers: Any, body: bytes, timeout_s: float,
                       connect_s: Any = None) -> httpx.Response:
        h = host(url)
        self.sent.append(h)
        todo = self.script[h]
        what = todo.pop(0) if len(todo) > 1 else todo[0]
        self.clock.now += 0.01
        if isinstance(what, BaseException):
            raise what
        code, ra = what if isinstance(what, tuple) else (what, None)
        r = httpx.Response(code, headers={"retry-after": ra} if ra else {}, stream=httpx.ByteStream(b"{}"))
        self.answers.append(r)
        return r


def connect_error() -> UpstreamUnavailable:
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError:
            raise UpstreamUnavailable("connect failed")  # noqa: B904
    except UpstreamUnavailable as e:
        return e


def reset_error() -> UpstreamUnavailable:
    return UpstreamUnavailable("reset")


def make(policy: Any, t: Transport, clock: Clock, budget: RetryBudgets | None = None) -> Sender:
    return Sender(t, policy.retry, BreakerBoard(policy.breaker, now=clock), Balancer(),
                  sleep=clock.sleep, rand=lambda: 1.0, budget=budget, clock=clock)


def run(sender: Sender, steps: list[Step], log: Attempts | None = None) -> tuple[httpx.Response, list[Picked]]:
    picked: list[Picked] = []
    resp = asyncio.run(sender.run(steps, lambda tg: {}, "k", log or Attempts(), picked.append))
    return resp, picked


A, B, C = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def test_a_reset_moves_on_at_once_and_connect_errors_retry_on_the_last_step_only() -> None:
    """d0 resets (next at once, no wait), d1 refuses the connection: being the last step it is
    retried after backoffs 0.1 and 0.2 (base 0.1, rand 1); attempts 3; then the last error."""
    policy, steps = setup(2, {"attempts": 3})
    clock = Clock()
    t = Transport(clock, {A: [reset_error()], B: [connect_error()]})
    s, log = make(policy, t, clock), Attempts()
    with pytest.raises(UpstreamUnavailable):
        run(s, steps, log)
    assert t.sent == [A, B, B, B] and clock.slept == [0.1, 0.2]
    assert log.count == 4 and log.reasons == ["d0:reset", "d1:connect", "d1:connect", "d1:connect"]
    assert s.balancer.inflight["d0"] == s.balancer.inflight["d1"] == 0
    assert s.breakers.get("d1").last_reason == "connect" and s.breakers.get("d1").consecutive == 3


def test_a_connect_error_not_on_the_last_step_moves_on() -> None:
    policy, steps = setup(2, {"attempts": 3})
    clock = Clock()
    t = Transport(clock, {A: [connect_error()], B: [200]})
    resp, picked = run(make(policy, t, clock), steps)
    assert resp.status_code == 200 and t.sent == [A, B] and clock.slept == []
    assert picked[0].target.deployment_name == "d1"


def test_a_status_not_retried_is_answered_as_is_and_counts_as_success() -> None:
    policy, steps = setup(2, {"attempts": 3}, breaker={"consecutive_failures": 5})
    clock = Clock()
    t = Transport(clock, {A: [503, 400], B: [200]})
    s = make(policy, t, clock)
    s.breakers.get("d0").failure("connect")
    # round robin turn 0 -> d0 first: 503 -> d1 at once (not last... d1 is last) -> 200
    resp, picked = run(s, steps)
    assert resp.status_code == 200 and t.sent == [A, B]
    resp, picked = run(s, steps)  # turn 1 -> d1 first
    assert t.sent[2] == B and resp.status_code == 200
    t2 = Transport(clock, {A: [400], B: [400]})
    s2 = make(policy, t2, clock)
    s2.breakers.get("d0").failure("x")
    resp, picked = run(s2, steps)
    assert resp.status_code == 400 and t2.sent == [A]
    assert s2.breakers.get("d0").consecutive == 0 and s2.breakers.get("d0").state == CLOSED
    assert picked[0].target.deployment_name == "d0" and s2.balancer.inflight["d0"] == 1
    picked[0].release()
    assert s2.balancer.inflight["d0"] == 0


def test_retry_after_within_the_limit_is_waited_on_the_same_deployment() -> None:
    """429 with retry-after 2 (limit 5): waited (max(2, backoff 0.1) = 2) and retried there."""
    policy, steps = setup(2, {"attempts": 2, "max_retry_after_s": 5})
    clock = Clock()
    t = Transport(clock, {A: [(429, "2"), 200], B: [200]})
    resp, _ = run(make(policy, t, clock), steps)
    assert resp.status_code == 200 and t.sent == [A, A] and clock.slept == [2.0]
    assert t.answers[0].is_closed  # the retried answer was closed


def test_retry_after_over_the_limit_ends_this_deployments_tries() -> None:
    """retry-after 10 > 5: not waited; d0 -> d1 at once; on the last step it is the answer."""
    policy, steps = setup(2, {"attempts": 3, "max_retry_after_s": 5})
    clock = Clock()
    t = Transport(clock, {A: [(503, "10")], B: [(503, "10")]})
    resp, picked = run(make(policy, t, clock), steps)
    assert resp.status_code == 503 and resp.headers["retry-after"] == "10"
    assert t.sent == [A, B] and clock.slept == []
    assert picked[0].target.deployment_name == "d1"
    # exactly at the limit: waited
    policy, steps = setup(1, {"attempts": 2, "max_retry_after_s": 5})
    t = Transport(clock, {A: [(503, "5"), 200]})
    resp, _ = run(make(policy, t, clock), steps)
    assert resp.status_code == 200 and t.sent == [A, A] and clock.slept[-1] == 5.0


def test_the_last_step_without_retry_after_retries_with_backoff_then_answers() -> None:
    policy, steps = setup(1, {"attempts": 3})
    clock = Clock()
    t = Transport(clock, {A: [502]})
    s, log = make(policy, t, clock), Attempts()
    resp, picked = run(s, steps, log)
    assert resp.status_code == 502 and t.sent == [A, A, A] and clock.slept == [0.1, 0.2]
    assert log.count == 3 and log.reasons == ["d0:status-502"] * 3
    assert [r.is_closed for r in t.answers] == [True, True, False]  # the answer is still open
    assert s.balancer.inflight["d0"] == 1  # held by the answer until the pipeline releases it
    picked[0].release()
    assert s.balancer.inflight["d0"] == 0 and s.breakers.get("d0").last_reason == "status-502"


def test_a_fallback_backend_is_the_last_step() -> None:
    policy, steps = setup(1, {"attempts": 2}, fallback=True)
    clock = Clock()
    t = Transport(clock, {A: [503], "10.0.9.9": [503, 200]})
    resp, picked = run(make(policy, t, clock), steps)
    assert resp.status_code == 200 and t.sent == [A, "10.0.9.9", "10.0.9.9"] and clock.slept == [0.1]
    assert picked[0].step is steps[1]


def test_open_breakers_are_skipped_while_another_can_serve() -> None:
    policy, steps = setup(3, {"attempts": 1}, breaker={"consecutive_failures": 1, "cooldown_s": 60})
    clock = Clock()
    t = Transport(clock, {A: [200], B: [200], C: [200]})
    s = make(policy, t, clock)
    for d in ("d0", "d2"):
        s.breakers.get(d).failure("connect")
    log = Attempts()
    resp, picked = run(s, steps, log)
    assert t.sent == [B] and log.all_open is False
    s.breakers.get("d1").failure("connect")
    log = Attempts()
    run(s, steps, log)
    assert log.all_open is True and len(t.sent) == 2  # all open: tried anyway


def test_a_failed_send_opens_its_breaker_with_the_status_as_reason() -> None:
    policy, steps = setup(2, {"attempts": 1}, breaker={"consecutive_failures": 1, "cooldown_s": 60})
    clock = Clock()
    t = Transport(clock, {A: [503], B: [200]})
    s = make(policy, t, clock)
    run(s, steps)
    b = s.breakers.get("d0")
    assert b.state == OPEN and b.last_reason == "status-503"
    assert s.breakers.get("d1").state == CLOSED


def test_order_puts_the_choice_first_then_the_rest_by_load() -> None:
    """prefix mode (no load guard): the placed deployment first, the others by (load,
    rendezvous); ``opened`` gets False when some breaker is closed."""
    policy, steps = setup(3, mode="prefix")
    clock = Clock()
    s = make(policy, Transport(clock, {}), clock)
    first = s.balancer.place("k", ["d0", "d1", "d2"], policy.backends["g"].affinity)
    s.balancer._keys.clear()
    s.balancer._live.clear()
    others = [d for d in ("d0", "d1", "d2") if d != f"d{first}"]
    s.balancer.inflight[others[0]] = 5
    s.balancer.inflight[others[1]] = 1
    opened: list[bool] = []
    got = asyncio.run(s.order(steps[0], "k", opened))
    assert [(d.name, why) for d, why in got] == [(f"d{first}", "affinity"), (others[1], "next"),
                                                (others[0], "next")]
    assert opened == [False]
    s.balancer.inflight[others[0]] = 1  # a tie in load: the key's rendezvous order breaks it
    got = asyncio.run(s.order(steps[0], "k"))
    assert [d.name for d, _ in got][1:] == [others[i] for i in rendezvous_order("k", others)]
    one, st1 = setup(1)
    s1 = make(one, Transport(clock, {}), clock)
    assert [(d.name, why) for d, why in asyncio.run(s1.order(st1[0], "k"))] == [("d0", "single")]


def test_the_round_robin_turn_advances_per_request() -> None:
    policy, steps = setup(3, {"attempts": 1})
    clock = Clock()
    t = Transport(clock, {A: [200], B: [200], C: [200]})
    s = make(policy, t, clock)
    for _ in range(4):
        run(s, steps)
    assert t.sent == [A, B, C, A]


def test_a_cancelled_send_releases_and_abandons_the_probe() -> None:
    policy, steps = setup(1, {"attempts": 1}, breaker={"consecutive_failures": 1, "cooldown_s": 1})
    clock = Clock()

    async def hang(*a: Any, **k: Any) -> httpx.Response:
        raise asyncio.CancelledError

    s = Sender(hang, policy.retry, BreakerBoard(policy.breaker, now=clock), Balancer(),
               sleep=clock.sleep, rand=lambda: 1.0, clock=clock)
    b = s.breakers.get("d0")
    b.failure("connect")
    clock.now = 5.0
    with pytest.raises(asyncio.CancelledError):
        run(s, steps)
    assert s.balancer.inflight["d0"] == 0 and b.probing is False and b.available()


def test_no_send_starts_past_total_s() -> None:
    """total_s 1: after the first send (0.01 s) a retry-after of 0.995 would start at 1.005:
    not made; the answer is returned."""
    policy, steps = setup(1, {"attempts": 3, "max_retry_after_s": 5}, timeouts={"total_s": 1.0})
    clock = Clock()
    t = Transport(clock, {A: [(503, "0.995"), 200]})
    resp, _ = run(make(policy, t, clock), steps)
    assert resp.status_code == 503 and t.sent == [A] and clock.slept == []
    t = Transport(clock, {A: [(503, "0.5"), 200]})
    clock.now = 0.0
    resp, _ = run(make(policy, t, clock), steps)
    assert resp.status_code == 200 and t.sent == [A, A]


def test_the_budget_is_spent_per_extra_send_only() -> None:
    policy, steps = setup(2, {"attempts": 1})
    clock = Clock()
    budget = RetryBudgets(ratio=0.0, burst=1.0)
    t = Transport(clock, {A: [503], B: [503]})
    run(make(policy, t, clock, budget), steps)
    assert t.sent == [A, B] and budget.of("g").tokens == 0.0  # the second send took the one token
    t2 = Transport(clock, {A: [503], B: [503]})
    resp, _ = run(make(policy, t2, clock, budget), steps)
    assert t2.sent == [A] and resp.status_code == 503  # none left: the first answer


def test_a_head_slower_than_first_byte_s_is_a_timeout_and_moves_on() -> None:
    """first_byte_s 0.05 below the read timeout (timeout_s): the head wait is bounded here."""
    policy, steps = setup(2, {"attempts": 1}, timeouts={"first_byte_s": 0.05})
    clock = Clock()
    sent: list[str] = []

    async def send(url: str, headers: Any, body: bytes, timeout_s: float, connect_s: Any = None) -> httpx.Response:
        sent.append(host(url))
        if host(url) == A:
            await asyncio.Event().wait()
        return httpx.Response(200, content=b"{}")

    s = Sender(send, policy.retry, BreakerBoard(policy.breaker), Balancer(), sleep=clock.sleep,
               rand=lambda: 1.0, clock=clock)
    log = Attempts()
    resp, _ = run(s, steps, log)
    assert resp.status_code == 200 and sent == [A, B] and log.reasons == ["d0:timeout"]
    assert s.balancer.inflight["d0"] == 0


def test_equally_loaded_next_deployments_follow_each_keys_rendezvous_order() -> None:
    """least_load mode, every load 0: after the choice, the rest are in the key's rendezvous
    order (highest sha256(key | name) first), so different keys spread their retries over
    different deployments instead of all falling back to the group's order."""
    policy, steps = setup(3, mode="least_load")
    clock = Clock()
    s = make(policy, Transport(clock, {}), clock)
    seen = set()
    for n in range(20):
        key = f"k{n}"
        got = [d.name for d, _ in asyncio.run(s.order(steps[0], key))]
        rest = [x for x in ("d0", "d1", "d2") if x != got[0]]
        assert got[1:] == [rest[i] for i in rendezvous_order(key, rest)]
        seen.add(tuple(got[1:]) == tuple(rest))
    assert seen == {True, False}  # some keys reverse the group's order
