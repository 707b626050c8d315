"""Retries are bounded (issue 20, class 6): one client request became 12 upstream sends
(3 tries x 4 deployments), still 12 with every breaker open, and ``retry-after`` waits plus head
timeouts added up past ``total_s``. The :class:`Sender` runs here on a fake transport, a stepped
clock and a recorded sleep, so each bound is checked exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.bridges import bridge_for
from prefixgate.proxy.core.errors import UpstreamUnavailable
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.retries import Attempts, RetryBudgets, Sender, Step
from prefixgate.proxy.routing.router import plan_targets


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _setup(n_deps: int, retry: dict[str, Any], total_s: float | None = None,
           fallback: bool = False, breaker: dict[str, Any] | None = None) -> tuple[Any, list[Step]]:
    deps = [{"name": f"d{i}", "base_url": f"http://10.0.0.{i + 1}:8000/v1"} for i in range(n_deps)]
    backends: dict[str, Any] = {"g": {"kind": "openai_compat", "deployments": deps,
                                      "affinity": {"mode": "round_robin"}}}
    if total_s is not None:
        backends["g"]["timeouts"] = {"total_s": total_s}
    route: dict[str, Any] = {"match": "*", "backend": "g"}
    if fallback:
        backends["f"] = {"kind": "openai_compat", "base_url": "http://10.0.9.9:8000/v1"}
        route["fallbacks"] = ["f"]
    policy = parse_policy({"backends": backends, "routes": [route], "retry": retry,
                           "breaker": breaker or {"enabled": False}})
    steps = [Step(t, bridge_for("openai", "openai"), b"{}")
             for t in plan_targets(policy, "m", "openai")]
    return policy, steps


def _sender(policy: Any, answer: Any, clock: Clock, budget: RetryBudgets | None = None
            ) -> tuple[Sender, list[str]]:
    sent: list[str] = []

    async def send(url: str, headers: Any, body: bytes, timeout_s: float, connect_s: Any = None
                   ) -> httpx.Response:
        sent.append(url)
        clock.now += 0.01
        return answer(url)

    return Sender(send, policy.retry, BreakerBoard(policy.breaker), Balancer(), sleep=clock.sleep,
                  rand=lambda: 1.0, budget=budget, clock=clock), sent


def _status(code: int, retry_after: str | None = None) -> Any:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return lambda url: httpx.Response(code, headers=headers, content=b"{}")


def _run(sender: Sender, steps: list[Step]) -> httpx.Response:
    return asyncio.run(sender.run(steps, lambda t: {}, "k", Attempts(), lambda p: p.release()))


def test_each_deployment_is_tried_once_while_another_remains() -> None:
    policy, steps = _setup(4, {"attempts": 3, "backoff_base_s": 0.1})
    sender, sent = _sender(policy, _status(503), Clock())
    assert _run(sender, steps).status_code == 503
    # three deployments once each, the last one of the plan up to `attempts` times: 6, not 12
    # (the round-robin choice first; the equally loaded rest in the key's rendezvous order)
    hosts = [u.split("//")[1].split(":")[0] for u in sent]
    assert hosts[0] == "10.0.0.1" and sorted(hosts[1:4]) == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert hosts[4:] == [hosts[3]] * 2


def test_a_retry_after_the_answer_names_is_retried_on_the_same_deployment() -> None:
    policy, steps = _setup(2, {"attempts": 3, "max_retry_after_s": 5})
    clock = Clock()
    sender, sent = _sender(policy, _status(429, "1"), clock)
    _run(sender, steps)
    hosts = [u.split("//")[1].split(":")[0] for u in sent]
    assert hosts == ["10.0.0.1"] * 3 + ["10.0.0.2"] * 3
    assert clock.slept.count(1.0) == 4  # each retry waited the retry-after it was told


def test_every_breaker_open_still_sends_at_most_once_per_deployment() -> None:
    policy, steps = _setup(4, {"attempts": 3, "backoff_base_s": 0},
                           breaker={"consecutive_failures": 1, "cooldown_s": 600})
    board_sender, sent = _sender(policy, _status(503), Clock())
    for d in policy.backends["g"].group("g"):  # open every breaker
        b = board_sender.breakers.get(d.name)
        b.before_send()
        b.failure("status-503")
    assert _run(board_sender, steps).status_code == 503
    assert len(sent) == 4 + 2  # once per deployment; the last of the plan retried


def test_the_retry_budget_bounds_retries_across_requests() -> None:
    policy, steps = _setup(4, {"attempts": 3, "backoff_base_s": 0})
    budget = RetryBudgets(ratio=0.5, burst=2)
    sender, sent = _sender(policy, _status(503), Clock(), budget)
    for _ in range(10):
        _run(sender, steps)
    # 10 first sends; retries: the burst of 2 plus 0.5 per request, never more
    assert len(sent) <= 10 + 2 + 5
    assert len(sent) >= 10 + 5  # and the budget is used, not refused outright


def test_an_empty_budget_sends_once_and_answers_with_the_last_upstream_answer() -> None:
    policy, steps = _setup(3, {"attempts": 3})
    sender, sent = _sender(policy, _status(503), Clock(), RetryBudgets(ratio=0, burst=0))
    assert _run(sender, steps).status_code == 503
    assert len(sent) == 1


def test_a_connect_error_without_budget_is_the_last_error() -> None:
    policy, steps = _setup(3, {"attempts": 3})
    clock = Clock()
    sent: list[str] = []

    async def send(url: str, headers: Any, body: bytes, timeout_s: float, connect_s: Any = None
                   ) -> httpx.Response:
        sent.append(url)
        try:
            raise ConnectionRefusedError
        except ConnectionRefusedError:
            raise UpstreamUnavailable("refused") from None

    sender = Sender(send, policy.retry, BreakerBoard(policy.breaker), Balancer(), sleep=clock.sleep,
                    budget=RetryBudgets(0, 1), clock=clock)
    with pytest.raises(UpstreamUnavailable):
        _run(sender, steps)
    assert len(sent) == 2  # the first send, then one paid for by the single token


@pytest.mark.parametrize("retry_after, sends", [("1", 3), ("2", 2)])
def test_waits_and_sends_stay_inside_total_s(retry_after: str, sends: int) -> None:
    policy, steps = _setup(1, {"attempts": 10, "max_retry_after_s": 5, "budget_burst": 100},
                           total_s=3.0)
    clock = Clock()
    sender, sent = _sender(policy, _status(503, retry_after), clock, RetryBudgets(1, 100))
    assert _run(sender, steps).status_code == 503
    assert clock.now < 3.0  # no wait or send starts past the deadline
    assert len(sent) == sends  # sends at 0, 1, 2 s (retry-after 1) or 0, 2 s (retry-after 2)


def test_one_backends_failures_leave_another_routes_fallbacks_their_budget() -> None:
    """Issue 34 item 7: the budget is per backend (Envoy's is per cluster). 40 failing requests of
    one route (backend ``a``, no fallback) drain ``a``'s budget; a request of another route whose
    own backend ``b`` fails still gets its fallback ``c``'s 200, and ``a`` itself stays bounded."""
    ip = {"a": "10.0.1.1", "b": "10.0.2.1", "c": "10.0.3.1"}
    backends = {n: {"kind": "openai_compat", "base_url": f"http://{h}:8000/v1"} for n, h in ip.items()}
    policy = parse_policy({
        "backends": backends, "breaker": {"enabled": False},
        "routes": [{"match": "a-*", "backend": "a"}, {"match": "b-*", "backend": "b", "fallbacks": ["c"]}],
        "retry": {"attempts": 3, "backoff_base_s": 0, "budget_ratio": 0.2, "budget_burst": 2}})

    def steps(model: str) -> list[Step]:
        return [Step(t, bridge_for("openai", "openai"), b"{}") for t in plan_targets(policy, model, "openai")]

    sender, sent = _sender(policy, lambda url: httpx.Response(200 if ip["c"] in url else 503,
                                                             content=b"{}"), Clock())
    for _ in range(40):
        assert _run(sender, steps("a-model")).status_code == 503
    a_sends = sum(ip["a"] in u for u in sent)
    assert a_sends <= 40 + 2 + 40 * 0.2 + 1  # a's retries stayed within a's own budget
    sent.clear()
    for _ in range(2):  # within b's own burst: neither fallback was spent by a's failures
        assert _run(sender, steps("b-model")).status_code == 200
    assert [next(n for n, h in ip.items() if h in u) for u in sent] == ["b", "c"] * 2
