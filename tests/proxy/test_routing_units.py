"""Units of issue 10's routing: the policy's new route / group fields (old files load
unchanged), the breaker's state machine on a stepped clock, the deployment choice rule."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.config.loader import PolicyError, default_policy, parse_policy
from prefixgate.config.routing import AffinitySettings, BreakerSettings
from prefixgate.proxy.core.errors import ModelNotFound
from prefixgate.proxy.routing.balance import choose, imbalanced, rendezvous
from prefixgate.proxy.routing.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from prefixgate.proxy.routing.retries import backoff_s, retry_after_s
from prefixgate.proxy.routing.router import plan_targets

GROUP = {"kind": "openai_compat", "deployments": [
    {"base_url": "http://10.0.0.1:8000/v1"}, {"base_url": "http://10.0.0.2:8000/v1",
                                              "api_key": "${K2}", "name": "second"}]}


def _policy(**extra: Any) -> Any:
    return parse_policy({"backends": {"g": GROUP,
                                      "oa": {"kind": "openai", "base_url": "https://o/v1"},
                                      "an": {"kind": "anthropic", "base_url": "https://a/v1"}},
                         "routes": [{"match": "llama-*", "backends": ["g", "oa"],
                                     "fallbacks": ["an", {"backend": "oa", "model": "gpt-x"}]},
                                    {"match": "gpt-4o-mini", "backend": "oa"}],
                         **extra})


def test_the_shipped_policy_and_a_plain_route_load_as_before() -> None:
    p = default_policy()
    assert [r.backend for r in p.routes] == ["openai", "openai", "anthropic", "local"]
    (t,) = plan_targets(p, "gpt-4o", "openai")
    assert (t.backend_name, t.url(), t.deployment_name) == (
        "openai", "https://api.openai.com/v1/chat/completions", "openai")


def test_a_group_takes_its_base_url_from_its_first_deployment_and_names_them() -> None:
    g = _policy().backends["g"]
    assert g.base_url == "http://10.0.0.1:8000/v1"
    assert [(d.name, d.api_key) for d in g.group("g")] == [("g#0", None), ("second", "${K2}")]


def test_a_route_plans_its_backends_then_its_fallbacks_with_their_models() -> None:
    ts = plan_targets(_policy(), "llama-3", "openai", can_translate=True)
    assert [(t.backend_name, t.model, t.translate) for t in ts] == [
        ("g", None, False), ("oa", None, False), ("an", None, True), ("oa", "gpt-x", False)]
    # a client that cannot be bridged keeps the fallbacks it can use
    assert [t.backend_name for t in plan_targets(_policy(), "llama-3", "openai")] == [
        "g", "oa", "oa"]


def test_an_alias_routes_and_sends_the_real_name() -> None:
    p = _policy(aliases={"fast": "gpt-4o-mini"})
    (t,) = plan_targets(p, "fast", "openai")
    assert (t.backend_name, t.model) == ("oa", "gpt-4o-mini")
    with pytest.raises(ModelNotFound):
        plan_targets(p, "slow", "openai")


@pytest.mark.parametrize("route,why", [
    ({"match": "*"}, "backend or backends"),
    ({"match": "*", "backend": "g", "backends": ["g"]}, "not both"),
    ({"match": "*", "backend": "g", "fallbacks": ["nope"]}, "nope"),
])
def test_bad_routes_are_refused_with_their_path(route: dict[str, Any], why: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy({"backends": {"g": GROUP}, "routes": [route]})
    assert why in str(e.value)


def test_a_literal_key_in_a_deployment_is_refused() -> None:
    bad = {**GROUP, "deployments": [{"base_url": "http://x/v1", "api_key": "sk-123"}]}
    with pytest.raises(PolicyError) as e:
        parse_policy({"backends": {"g": bad}, "routes": [{"match": "*", "backend": "g"}]})
    assert "environment reference" in str(e.value)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_breaker_opens_on_consecutive_failures_probes_once_and_closes() -> None:
    clock = Clock()
    b = Breaker(BreakerSettings(consecutive_failures=3, cooldown_s=10), clock)
    for _ in range(2):
        b.failure("status-503")
    b.success()  # the run is broken: still closed
    for _ in range(3):
        b.failure("status-503")
    assert b.state == OPEN and not b.available()
    clock.t += 10
    assert b.available()
    b.before_send()
    assert b.state == HALF_OPEN and not b.available()  # one probe at a time
    b.abandoned()  # the probe's client left: no verdict, another probe may go
    assert b.available()
    b.before_send()
    b.failure("connect")
    assert b.state == OPEN and not b.available()  # the probe failed: another cooldown
    clock.t += 10
    b.before_send()
    b.success()
    assert b.state == CLOSED and b.available()


def test_breaker_opens_on_error_rate_within_its_window() -> None:
    clock = Clock()
    b = Breaker(BreakerSettings(consecutive_failures=100, error_rate=0.5, min_requests=10,
                                window_s=30), clock)
    for i in range(9):
        b.failure("status-500") if i % 2 else b.success()
    assert b.state == CLOSED  # 9 outcomes: under min_requests
    clock.t += 31  # the window forgets them
    for i in range(10):
        b.failure("status-500") if i % 2 else b.success()
    assert b.state == OPEN  # 5 of 10 failed


def test_choice_keeps_a_key_on_one_deployment_while_balanced() -> None:
    names = ["r0", "r1", "r2"]
    s = AffinitySettings(mode="prefix", imbalance_abs=2, imbalance_rel=1.5)
    picks = {choose(names, [1, 1, 2], f"session-{k}", s).index for k in range(60)}
    assert picks == {0, 1, 2}  # keys spread
    for k in range(20):
        key = f"session-{k}"
        first = choose(names, [0, 0, 0], key, s)
        assert first.why == "affinity" and choose(names, [2, 1, 0], key, s).index == first.index


def test_past_both_thresholds_the_least_loaded_deployment_is_taken() -> None:
    s = AffinitySettings(mode="prefix", imbalance_abs=2, imbalance_rel=1.5)
    assert imbalanced([5, 2, 2], 2, 1.5) and not imbalanced([4, 3, 3], 2, 1.5)
    assert not imbalanced([20, 17, 17], 2, 1.5)  # the absolute gap alone is not enough
    c = choose(["a", "b", "c"], [6, 3, 1], "k", s)
    assert (c.index, c.why) == (2, "load_guard")


def test_exact_mode_takes_the_longest_cached_prefix() -> None:
    s = AffinitySettings(mode="exact")
    assert choose(["a", "b", "c"], [1, 1, 1], "k", s, matches=[0, 120, 40]).index == 1
    no_match = choose(["a", "b", "c"], [1, 1, 1], "k", s, matches=[0, 0, 0])
    assert no_match.why == "affinity"


def test_rendezvous_moves_only_the_keys_of_a_deployment_that_leaves() -> None:
    names = ["r0", "r1", "r2", "r3"]
    before = {k: names[rendezvous(k, names)] for k in map(str, range(200))}
    rest = names[:3]
    after = {k: rest[rendezvous(k, rest)] for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == "r3"}


def test_retry_after_reads_seconds_and_dates_and_backoff_is_capped() -> None:
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470) == 10
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None
    from prefixgate.config.routing import RetrySettings
    r = RetrySettings(backoff_base_s=0.5, backoff_max_s=1.0)
    assert backoff_s(1, r, lambda: 1.0) == 0.5 and backoff_s(5, r, lambda: 1.0) == 1.0
    assert backoff_s(3, r, lambda: 0.0) == 0.0


def test_the_fleet_policy_example_of_the_readme_loads() -> None:
    from pathlib import Path

    from prefixgate.config.loader import load_policy
    p = load_policy(Path(__file__).resolve().parents[2] / "docs" / "fleet_policy.yaml")
    assert [d.name for d in p.backends["fleet"].group("fleet")] == ["vllm-a", "vllm-b",
                                                                    "sglang-c"]
    assert [t.backend_name for t in plan_targets(p, "fast", "openai")] == ["fleet", "openai"]


def test_models_lists_aliases_and_exact_route_names_only() -> None:
    import asyncio

    from prefixgate.proxy.api.models import list_models
    p = _policy(aliases={"fast": "gpt-4o-mini", "broken": "no-route-matches-this"})
    got = asyncio.run(list_models(None, p))
    assert {m["id"]: m["owned_by"] for m in got["data"]} == {"fast": "oa", "gpt-4o-mini": "oa"}
