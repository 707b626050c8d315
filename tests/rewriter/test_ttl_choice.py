"""Write TTLs chosen by expected cost (``prefixgate/rewriter/analysis/ttl_choice.py``, ``breakpoints.py`` with
``breakpoint_ttl: auto``): costs computed by hand, the 1h-before-5m rule, arrival memory."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.provider_models.anthropic import breakpoints as api_breakpoints
from prefixgate.cache.provider_models.prefix_blocks import anthropic_blocks
from prefixgate.rewriter.analysis import ttl_choice
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.analysis.ttl_choice import MAX_GAPS, plan, segment_cost, tail, updated
from prefixgate.rewriter.pipeline import rewrite_request
from tests.rewriter.helpers import ctx


def test_tail_of_the_fitted_lognormal() -> None:
    # logs 4 and 5: mu 4.5, sigma sqrt(0.5); the median e^4.5 has half the mass above it
    assert tail([math.e ** 4, math.e ** 5], math.e ** 4.5) == pytest.approx(0.5)
    # gaps 60, 60, 600: logs 4.094, 4.094, 6.397 -> mu 4.862, sigma 1.330;
    # z(300 s) = (5.704 - 4.862) / 1.330 = 0.633 -> 0.263; z(3600 s) = 2.502 -> 0.0062
    assert tail([60, 60, 600], 300) == pytest.approx(0.263, abs=0.002)
    assert tail([60, 60, 600], 3600) == pytest.approx(0.0062, abs=0.0005)
    # identical gaps: sigma floors at 0.25, so 30 s gaps never reach 5 minutes (z = 9.2)
    assert tail([30, 30, 30], 300) < 1e-15


def test_segment_cost_by_hand() -> None:
    # 30 s gaps: the next request always reads. 5m: 1.25*200 + 1000*0.1 = 350; 1h: 2*200 + 100
    assert segment_cost("5m", 1000, 200, [30, 30, 30]) == pytest.approx(350)
    assert segment_cost("1h", 1000, 200, [30, 30, 30]) == pytest.approx(500)
    # 1000 s gaps: a 5m entry is always gone (rewrite 1000 * 1.25), a 1h entry read
    assert segment_cost("5m", 1000, 200, [1000] * 3) == pytest.approx(250 + 1250, rel=1e-5)
    assert segment_cost("1h", 1000, 200, [1000] * 3) == pytest.approx(400 + 100, rel=1e-5)


def test_plan_splits_a_long_system_prompt_from_the_conversation_tail() -> None:
    gaps = [60, 60, 600]  # p(5m) 0.263, p(1h) 0.0062 (above)
    p5, p1 = tail(gaps, 300), tail(gaps, 3600)
    # system: 5000 tokens already cached; tail: 300 new tokens
    s5, s1 = 5000 * ((1 - p5) * 0.1 + p5 * 1.25), 5000 * ((1 - p1) * 0.1 + p1 * 2.0)
    t5, t1 = 1.25 * 300 + 300 * ((1 - p5) * 0.1 + p5 * 1.25), 2.0 * 300 + 300 * (
        (1 - p1) * 0.1 + p1 * 2.0)
    assert (s5, s1, t5, t1) == pytest.approx((2012, 559, 496, 634), rel=0.005)
    assert [segment_cost(t, 5000, 0, gaps) for t in ("5m", "1h")] == pytest.approx([s5, s1])
    ttls, why = plan([(5000, 0), (300, 300)], gaps)
    assert ttls == ["1h", "5m"] and "1 x 1h then 1 x 5m" in why
    assert plan([(5000, 0), (300, 300)], [30, 30, 30])[0] == ["5m", "5m"]
    assert plan([(5000, 0), (300, 300)], [1000, 1000, 1000])[0] == ["1h", "1h"]
    assert plan([(5000, 0)], [1000, 1000])[0] == ["5m"]  # fewer than MIN_SAMPLES gaps


@settings(max_examples=200, deadline=None)
@given(segs=st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 20000)), min_size=1,
                     max_size=4),
       gaps=st.lists(st.floats(0.1, 20000), min_size=3, max_size=10))
def test_plan_is_1h_before_5m_and_the_cheapest_split(segs: list[tuple[int, int]],
                                                     gaps: list[float]) -> None:
    segs = [(n, min(n, d)) for n, d in segs]
    ttls, _ = plan(segs, gaps)
    assert ttls == sorted(ttls, key=lambda t: t != "1h")  # no 1h after a 5m
    cost = sum(segment_cost(t, n, d, gaps) for t, (n, d) in zip(ttls, segs))
    for j in range(len(segs) + 1):
        other = ["1h"] * j + ["5m"] * (len(segs) - j)
        assert cost <= sum(segment_cost(t, n, d, gaps) for t, (n, d) in zip(other, segs)) + 1e-6


def test_arrivals_memory_files_each_gap_under_the_previous_kind_and_is_bounded() -> None:
    mem: dict[str, Any] = updated({}, 100.0, "user")
    mem = updated(mem, 130.0, "tool")
    mem = updated(mem, 135.5, "user")
    assert mem["g"] == {"user": [30.0], "tool": [5.5]} and mem["t"] == 135.5
    for i in range(100):
        mem = updated(mem, 136.0 + i, "user")
    assert len(mem["g"]["user"]) == MAX_GAPS
    assert updated({"t": 500.0, "k": "user", "g": "junk"}, 400.0, "user")["g"] == {
        "tool": [], "user": []}  # a clock going back files nothing; junk reads as empty


SYSTEM = "You are a careful airline agent. " * 400


def _body(turns: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs += [{"role": "user", "content": f"question {i} " + "detail " * 30},
                 {"role": "assistant", "content": f"answer {i}"}]
    msgs.append({"role": "user", "content": "and now?"})
    return {"model": "claude-sonnet-4-5", "max_tokens": 10, "system": SYSTEM, "messages": msgs}


def _ttls(body: dict[str, Any]) -> list[str]:
    return [ttl for _, ttl in api_breakpoints(body, anthropic_blocks(body, count_tokens))]


@pytest.mark.parametrize(("gap", "expected"), [(30.0, {"5m"}), (1000.0, {"1h"}),
                                               (None, {"5m"})])
def test_auto_ttl_in_the_breakpoint_pass(gap: float | None, expected: set[str]) -> None:
    memory: dict[str, Any] = {}
    t = 0.0
    for turn in range(5):
        c = ctx("anthropic", memory, model="claude-sonnet-4-5")
        if gap is not None:
            c = type(c)(**{**c.__dict__, "now_s": t})
        r = rewrite_request(_body(turn), "anthropic", c)
        for e in r.edits:
            memory.update(e.memory)
        t += gap or 0.0
    ttls = _ttls(r.body)  # the API's own check: raises for a 1h marker after a 5m one
    assert set(ttls) == expected
    assert (ttl_choice.MEMORY_KEY in memory) == (gap is not None)


def test_fixed_ttl_policy_is_kept() -> None:
    c = ctx("anthropic", {ttl_choice.MEMORY_KEY: {"g": {"user": [1000.0] * 5}}},
            model="claude-sonnet-4-5", breakpoint_ttl="5m")
    assert set(_ttls(rewrite_request(_body(2), "anthropic", c).body)) == {"5m"}
