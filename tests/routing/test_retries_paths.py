"""The Sender's arguments and bounds, each at one point (issue 21, the mutants of
:mod:`prefixgate.proxy.routing.retries` that test_retries_pinned.py left alive).

Source: the module docstring of retries.py (what is sent where, the total deadline and the retry
budget before every extra send and wait, the shared breakers and loads told of every outcome
with the state before it, the first-byte timer and its cancellation, the shielded close of a
retried answer) and balance.py's (the placement and exact matches that order a group).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import anyio
import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.bridges import bridge_for
from prefixgate.proxy.core.errors import UpstreamTimeout, UpstreamUnavailable
from prefixgate.proxy.routing.balance import Balancer, rendezvous, rendezvous_order
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.retries import Attempts, Picked, RetryBudgets, Sender, Step
from prefixgate.proxy.routing.router import plan_targets
from tests.routing.test_retries_pinned import A, B, Clock, Transport, connect_error, host, reset_error


def policy_of(groups: dict[str, int], mode: str = "round_robin", retry: dict[str, Any] | None = None,
              timeouts: dict[str, Any] | None = None, balance: float = 1.0) -> Any:
    backends: dict[str, Any] = {}
    for g, n in groups.items():
        deps = [{"name": f"{g}{i}", "base_url": f"http://10.0.{len(backends)}.{i + 1}:8000/v1"} for i in range(n)]
        backends[g] = {"kind": "openai_compat", "deployments": deps,
                       "affinity": {"mode": mode, "imbalance_abs": 2, "session_balance": balance},
                       **({"timeouts": timeouts} if timeouts else {})}
    names = list(groups)
    route: dict[str, Any] = {"match": "*", "backend": names[0]}
    if len(names) > 1:
        route["fallbacks"] = names[1:]
    return parse_policy({"backends": backends, "routes": [route],
                         "retry": {"backoff_base_s": 0.1, **(retry or {})}, "breaker": {"enabled": False}})


def steps_of(policy: Any, body: bytes = b'{"a":1}') -> list[Step]:
    return [Step(t, bridge_for("openai", "openai"), body) for t in plan_targets(policy, "m", "openai")]


class Shared:
    """Records what the Sender tells the shared routing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def refresh(self, names: list[str]) -> None:
        self.calls.append(("refresh", list(names)))

    async def failed(self, name: str, was: str) -> None:
        self.calls.append(("failed", name, was))

    def succeeded(self, name: str, was: str) -> None:
        self.calls.append(("succeeded", name, was))


def sender(policy: Any, send: Any, clock: Clock, **kw: Any) -> Sender:
    return Sender(send, policy.retry, BreakerBoard(policy.breaker, now=clock), Balancer(),
                  sleep=clock.sleep, rand=lambda: 1.0, clock=clock, **kw)


def go(s: Sender, steps: list[Step], key: str = "k", log: Attempts | None = None) -> tuple[Any, list[Picked]]:
    picked: list[Picked] = []
    r = asyncio.run(s.run(steps, lambda t: {"x-dep": t.deployment_name.encode()}, key, log or Attempts(),
                          picked.append))
    return r, picked


class Recorder:
    def __init__(self, clock: Clock, answer: int = 200, dt: float = 0.0) -> None:
        self.clock, self.answer, self.dt, self.calls = clock, answer, dt, []

    async def __call__(self, url: str, headers: Any, body: bytes, timeout_s: float, connect_s: Any = None) -> Any:
        self.calls.append((host(url), dict(headers), body, timeout_s, connect_s))
        self.clock.now += self.dt
        return httpx.Response(self.answer, content=b"{}")


@pytest.mark.parametrize(("timeouts", "read"), [({"connect_s": 3.0, "idle_s": 40.0}, 600.0),
                                               ({"connect_s": 3.0, "first_byte_s": 5.0, "idle_s": 40.0}, 40.0)])
def test_what_is_sent_reaches_the_transport(timeouts: dict[str, Any], read: float) -> None:
    """The step's body, the target's headers, read timeout = max(first byte, idle) (first byte
    unset: timeout_s, 600), the connect timeout 3 — without and with the first-byte timer."""
    p = policy_of({"g": 1}, timeouts=timeouts)
    clock = Clock()
    rec = Recorder(clock)
    r, picked = go(sender(p, rec, clock), steps_of(p))
    assert r.status_code == 200
    assert rec.calls == [("10.0.0.1", {"x-dep": b"g0"}, b'{"a":1}', read, 3.0)]


def test_no_steps_raise_no_deployment() -> None:
    p = policy_of({"g": 1})
    clock = Clock()
    with pytest.raises(UpstreamUnavailable) as e:
        go(sender(p, Recorder(clock), clock), [])
    assert str(e.value) == "no deployment to send to"


def test_the_first_byte_wait_is_cut_to_the_deadline_and_the_send_cancelled() -> None:
    """first_byte_s 0.2, total_s 0.05: the head is waited for 0.05 s (what the deadline
    leaves), the hanging send is cancelled, the error names both."""
    p = policy_of({"g": 1}, timeouts={"first_byte_s": 0.2, "total_s": 0.05})
    clock = Clock()
    cancelled: list[bool] = []

    async def hang(*a: Any, **k: Any) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    clock.now = 10.0  # the deadline is 10.05 on this clock: what is left is 0.05
    with pytest.raises(UpstreamTimeout) as e:
        go(sender(p, hang, clock), steps_of(p))
    assert str(e.value) == "upstream 'g0' sent no response head within 0.05 s"
    assert cancelled == [True]


def test_a_request_cancelled_while_waiting_for_the_head_cancels_its_send() -> None:
    """first_byte_s 5 (a timer): the client leaves during the wait: the send is cancelled
    too, and the cancellation goes on up."""
    p = policy_of({"g": 1}, timeouts={"first_byte_s": 5.0})
    clock = Clock()
    cancelled: list[bool] = []
    waiting = asyncio.Event()

    async def hang(*a: Any, **k: Any) -> Any:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        s = sender(p, hang, clock)
        task = asyncio.ensure_future(s.run(steps_of(p), lambda t: {}, "k", Attempts(), lambda x: None))
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.balancer.inflight["g0"] == 0

    asyncio.run(main())
    assert cancelled == [True]


def test_a_first_byte_timeout_equal_to_the_read_timeout_sets_no_timer() -> None:
    """first_byte_s == read timeout (0.05 = idle = timeout_s): the transport's own timeout
    bounds the head; no timer of 0.05 s is raced against a 0.1 s answer."""
    p = policy_of({"g": 1}, timeouts={"first_byte_s": 0.05, "idle_s": 0.05})
    clock = Clock()

    async def slow(*a: Any, **k: Any) -> Any:
        await asyncio.sleep(0.1)
        return httpx.Response(200, content=b"{}")

    r, _ = go(sender(p, slow, clock), steps_of(p))
    assert r.status_code == 200


def test_a_send_exactly_at_the_deadline_is_not_made() -> None:
    """total 1.0, the answer at t=0 (an instant transport) says retry-after 1.0: 0 + 1.0 >= 1.0,
    not waited; retry-after 0.9 is."""
    p = policy_of({"g": 1}, retry={"attempts": 2, "max_retry_after_s": 5}, timeouts={"total_s": 1.0})
    for ra, want, slept in (("1.0", 503, []), ("0.9", 200, [0.9])):
        clock = Clock()
        answers = [httpx.Response(503, headers={"retry-after": ra}, content=b"{}"),
                   httpx.Response(200, content=b"{}")]

        async def send(*a: Any, **k: Any) -> Any:
            return answers.pop(0)

        r, _ = go(sender(p, send, clock), steps_of(p))
        assert (r.status_code, clock.slept) == (want, slept)


def test_no_next_deployment_after_the_deadline() -> None:
    """d0 resets after 2 s (total 1 s): d1 is not tried; the reset is the error."""
    p = policy_of({"g": 2}, retry={"attempts": 1}, timeouts={"total_s": 1.0})
    clock = Clock()

    async def send(url: str, *a: Any, **k: Any) -> Any:
        clock.now += 2.0
        raise reset_error()

    with pytest.raises(UpstreamUnavailable):
        go(sender(p, send, clock), steps_of(p))
    assert clock.now == 2.0


def test_the_next_deployment_needs_no_pause_before_the_deadline() -> None:
    """d0 resets at t=0.01 (total 1 s): d1 is tried at once (0.01 + 0 < 1)."""
    p = policy_of({"g": 2}, retry={"attempts": 1}, timeouts={"total_s": 1.0})
    clock = Clock()
    t = Transport(clock, {A: [reset_error()], B: [200]})
    r, _ = go(sender(p, t, clock), steps_of(p))
    assert r.status_code == 200 and t.sent == [A, B]


def test_moving_on_after_a_long_retry_after_needs_no_wait_before_the_deadline() -> None:
    """503 with retry-after 10 (> 5) on d0, total 1 s: d1 is sent to at t=0.01 with no pause."""
    p = policy_of({"g": 2}, retry={"attempts": 2, "max_retry_after_s": 5}, timeouts={"total_s": 1.0})
    clock = Clock()
    t = Transport(clock, {A: [(503, "10")], B: [200]})
    r, _ = go(sender(p, t, clock), steps_of(p))
    assert r.status_code == 200 and t.sent == [A, B] and clock.slept == []


def test_a_connect_retry_waits_only_inside_the_deadline() -> None:
    """total 0.15: connect error at 0.01, backoff 0.1 -> 0.11 < 0.15: retried; error at 0.12,
    backoff 0.2 -> past: the error, no third send."""
    p = policy_of({"g": 1}, retry={"attempts": 3}, timeouts={"total_s": 0.15})
    clock = Clock()
    t = Transport(clock, {A: [connect_error()]})
    with pytest.raises(UpstreamUnavailable):
        go(sender(p, t, clock), steps_of(p))
    assert t.sent == [A, A] and clock.slept == [0.1]


def test_a_connect_retry_spends_one_budget_token_not_two() -> None:
    p = policy_of({"g": 1}, retry={"attempts": 3})
    clock = Clock()
    budget = RetryBudgets(ratio=0.0, burst=1.0)
    t = Transport(clock, {A: [connect_error(), 200]})
    r, _ = go(sender(p, t, clock, budget=budget), steps_of(p))
    assert r.status_code == 200 and t.sent == [A, A] and budget.of("g").tokens == 0.0


def test_the_shared_routing_is_told_each_outcome_with_the_state_before() -> None:
    p = policy_of({"g": 2}, retry={"attempts": 1})
    clock = Clock()
    shared = Shared()
    t = Transport(clock, {A: [reset_error()], B: [503]})
    s = sender(p, t, clock, shared=shared)
    go(s, steps_of(p))
    assert shared.calls == [("refresh", ["g0", "g1"]), ("failed", "g0", "closed"), ("failed", "g1", "closed")]
    shared.calls.clear()
    t2 = Transport(clock, {A: [200], B: [200]})
    s2 = sender(p, t2, clock, shared=shared)
    go(s2, steps_of(p))
    assert shared.calls == [("refresh", ["g0", "g1"]), ("succeeded", "g0", "closed")]
    one = policy_of({"g": 1})
    shared.calls.clear()
    go(sender(one, Recorder(clock), clock, shared=shared), steps_of(one))
    assert shared.calls == [("succeeded", "g0", "closed")]  # a single deployment: no read


def test_the_balancer_counts_why_each_deployment_served() -> None:
    p = policy_of({"g": 2}, retry={"attempts": 1})
    clock = Clock()
    t = Transport(clock, {A: [503], B: [503]})
    s = sender(p, t, clock)
    go(s, steps_of(p))
    assert s.balancer.served == collections.Counter({("g0", "round_robin"): 1, ("g1", "next"): 1})


def test_the_last_answer_names_its_step() -> None:
    p = policy_of({"g": 1}, retry={"attempts": 1})
    clock = Clock()
    steps = steps_of(p)
    r, picked = go(sender(p, Transport(clock, {A: [503]}), clock), steps)
    assert r.status_code == 503 and picked[0].step is steps[0] and picked[0].target.deployment_name == "g0"


def test_round_robin_turns_are_per_group() -> None:
    """Two groups, one step each: each group's first request takes its own first deployment."""
    p = policy_of({"g": 2, "h": 2})
    clock = Clock()
    s = sender(p, Recorder(clock), clock)
    steps = steps_of(p)
    assert [d.name for d, _ in asyncio.run(s.order(steps[0], "k"))] == ["g0", "g1"]
    assert [d.name for d, _ in asyncio.run(s.order(steps[1], "k"))] == ["h0", "h1"]


def test_prefix_placement_orders_the_group_not_plain_rendezvous() -> None:
    """balance 1.0, 2 deployments: key k2's first choice already holds k1 (cap ceil(2/2) = 1),
    so k2 is placed on its second choice and sent there."""
    p = policy_of({"g": 2}, mode="prefix", retry={"attempts": 1})
    names = ["g0", "g1"]
    k1 = "k"
    k2 = next(f"x{i}" for i in range(100) if rendezvous_order(f"x{i}", names)[0] == rendezvous_order(k1, names)[0])
    clock = Clock()
    rec = Recorder(clock)
    s = sender(p, rec, clock)
    go(s, steps_of(p), key=k1)
    go(s, steps_of(p), key=k2)
    second = names[rendezvous_order(k2, names)[1]]
    assert [c[1]["x-dep"].decode() for c in rec.calls] == [names[rendezvous(k1, names)], second]
    got = asyncio.run(s.order(steps_of(p)[0], k2))
    assert [(d.name, why) for d, why in got][0] == (second, "affinity")


G3 = ["g0", "g1", "g2"]
#: a key whose rendezvous choice differs from another key's ("None"), over 3 and over g1 / g2
KEY = next(f"k{i}" for i in range(500) if rendezvous(f"k{i}", G3) != rendezvous("None", G3)
           and rendezvous(f"k{i}", G3[1:]) != rendezvous("None", G3[1:]))


def test_the_request_key_decides_the_placement() -> None:
    """3 deployments, a fresh balancer: the key goes to its own rendezvous choice, not
    another key's."""
    p = policy_of({"g": 3}, mode="prefix", retry={"attempts": 1})
    clock = Clock()
    rec = Recorder(clock)
    go(sender(p, rec, clock), steps_of(p), key=KEY)
    assert rec.calls[0][1]["x-dep"] == G3[rendezvous(KEY, G3)].encode()


def test_exact_mode_asks_the_match_and_takes_the_longest() -> None:
    p = policy_of({"g": 3}, mode="exact")
    clock = Clock()
    asked: list[tuple[Any, ...]] = []

    async def match(target: Any, deps: list[Any], body: bytes) -> list[int]:
        asked.append((target.backend_name, [d.name for d in deps], body))
        return [0, 500, 20]

    s = sender(p, Recorder(clock), clock, match=match)
    steps = steps_of(p)
    got = asyncio.run(s.order(steps[0], KEY))  # a new key: its placement, nothing asked
    assert got[0][1] == "affinity" and asked == []
    got = asyncio.run(s.order(steps[0], KEY))
    assert got[0][0].name == "g1" and got[0][1] == "cache_match"
    assert asked == [("g", ["g0", "g1", "g2"], b'{"a":1}')]
    # no match function: exact mode falls back to the placement, and nothing is asked
    s2 = sender(p, Recorder(clock), clock)
    got = asyncio.run(s2.order(steps[0], KEY))
    assert got[0] == (got[0][0], "affinity") and got[0][0].name == G3[rendezvous(KEY, G3)]
    # exact mode with nothing matching: the placement (bounded load) decides, as in prefix mode
    s3 = sender(p, Recorder(clock), clock, match=lambda t, d, b: _zeros(len(d)))
    k2 = next(f"x{i}" for i in range(200)
              if rendezvous_order(f"x{i}", ["g0", "g1", "g2"])[0] == rendezvous("k", ["g0", "g1", "g2"]))
    asyncio.run(s3.order(steps[0], "k"))
    got = asyncio.run(s3.order(steps[0], k2))
    assert got[0][0].name == ["g0", "g1", "g2"][rendezvous_order(k2, ["g0", "g1", "g2"])[1]]


async def _zeros(n: int) -> list[int]:
    return [0] * n


def test_prefix_mode_never_asks_the_match() -> None:
    p = policy_of({"g": 3}, mode="prefix")
    clock = Clock()
    asked: list[Any] = []

    async def match(*a: Any) -> list[int]:
        asked.append(a)
        return [0, 0, 0]

    asyncio.run(sender(p, Recorder(clock), clock, match=match).order(steps_of(p)[0], "k"))
    assert asked == []


def test_the_load_guard_breaks_ties_by_the_request_key() -> None:
    """loads g0 9, g1 0, g2 0 (gap 9 > 2): the least loaded, g1 / g2 tied, by rendezvous of
    the request's key (not another key's)."""
    p = policy_of({"g": 3}, mode="prefix")
    clock = Clock()
    s = sender(p, Recorder(clock), clock)
    s.balancer.inflight["g0"] = 9
    got = asyncio.run(s.order(steps_of(p)[0], KEY))
    assert got[0] == (got[0][0], "load_guard") and got[0][0].name == G3[1:][rendezvous(KEY, G3[1:])]


def test_a_retried_answer_is_closed_even_when_the_request_is_cancelled_meanwhile() -> None:
    """The close of a retried answer is shielded: a cancellation of its anyio scope (how
    Starlette ends a request whose client left) arriving during it waits for the close. (A
    native ``task.cancel()`` is not held by anyio's shield on asyncio.)"""
    p = policy_of({"g": 1}, retry={"attempts": 2})
    clock = Clock()
    started, gate = asyncio.Event(), asyncio.Event()
    closed: list[bool] = []

    class SlowClose(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            yield b"{}"

        async def aclose(self) -> None:
            started.set()
            await gate.wait()
            closed.append(True)

    async def send(*a: Any, **k: Any) -> Any:
        return httpx.Response(503, stream=SlowClose())

    async def main() -> None:
        s = sender(p, send, clock)
        scope = anyio.CancelScope()

        async def request() -> None:
            with scope:
                await s.run(steps_of(p), lambda t: {}, "k", Attempts(), lambda x: None)

        async def client_leaves() -> None:
            await started.wait()
            scope.cancel()
            await asyncio.sleep(0.01)
            gate.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(request)
            tg.start_soon(client_leaves)

    asyncio.run(main())
    assert closed == [True]


def test_a_known_keys_match_elsewhere_moves_its_placement_there() -> None:
    """Exact mode: a known key whose longest match is not its placement goes there and its
    placement follows (its history is there now); a later turn matching nothing goes there too."""
    p = policy_of({"g": 3}, mode="exact")
    clock = Clock()
    answer: list[list[int]] = [[0, 0, 0]]

    async def match(target: Any, deps: list[Any], body: bytes) -> list[int]:
        return answer[0]

    s = sender(p, Recorder(clock), clock, match=match)
    step = steps_of(p)[0]
    first = asyncio.run(s.order(step, KEY))[0]
    assert first[1] == "affinity"
    placed = G3.index(first[0].name)
    moved = (placed + 1) % 3
    answer[0] = [500 if i == moved else 0 for i in range(3)]
    got = asyncio.run(s.order(step, KEY))[0]
    assert (got[0].name, got[1]) == (G3[moved], "cache_match")
    assert s.balancer._keys[KEY][0] == G3[moved]
    assert (s.balancer._live[G3[placed]], s.balancer._live[G3[moved]]) == (0, 1)
    answer[0] = [0, 0, 0]
    got = asyncio.run(s.order(step, KEY))[0]
    assert (got[0].name, got[1]) == (G3[moved], "affinity")


def test_a_load_guard_move_leaves_the_placement_where_it_was() -> None:
    """The load guard sends one turn elsewhere; the key's placement (and its cache) stays, so
    the next balanced turn goes back to it."""
    for mode in ("prefix", "exact"):
        p = policy_of({"g": 3}, mode=mode)
        clock = Clock()
        s = sender(p, Recorder(clock), clock, match=lambda t, d, b: _zeros(len(d)))
        step = steps_of(p)[0]
        placed = asyncio.run(s.order(step, KEY))[0][0].name
        s.balancer.inflight[placed] = 9
        got = asyncio.run(s.order(step, KEY))[0]
        assert got[1] == "load_guard" and got[0].name != placed
        assert s.balancer._keys[KEY][0] == placed and s.balancer._live[placed] == 1
        s.balancer.inflight[placed] = 0
        back = asyncio.run(s.order(step, KEY))[0]
        assert (back[0].name, back[1]) == (placed, "affinity")


def test_a_llamacpp_request_names_its_conversations_slot_of_that_deployment() -> None:
    """``llamacpp`` backends: the body sent carries ``id_slot``, the conversation's own slot of
    the deployment it went to; another conversation takes the other free slot; the same one
    comes back to its slot."""
    p = parse_policy({"backends": {"lc": {"kind": "llamacpp", "slots": 2, "deployments": [
        {"name": "lc0", "base_url": "http://10.0.9.1:8000/v1"}]}},
        "routes": [{"match": "*", "backend": "lc"}], "breaker": {"enabled": False}})
    clock = Clock()
    rec = Recorder(clock)
    s = sender(p, rec, clock)
    steps = steps_of(p)
    for key in ("conv-a", "conv-b", "conv-a"):
        go(s, steps, key=key)
    assert [c[2] for c in rec.calls] == [b'{"id_slot":0,"a":1}', b'{"id_slot":1,"a":1}',
                                         b'{"id_slot":0,"a":1}']
    assert (s.balancer.slots.live("lc0", 0), s.balancer.slots.live("lc0", 1)) == (1, 1)
