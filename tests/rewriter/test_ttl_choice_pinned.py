"""Write-TTL choice pinned point by point (issue 21): :mod:`prefixgate.rewriter.analysis.ttl_choice`.

Source: its module docstring — the lognormal tail ``p(T)`` (mean and sample standard deviation
of the logs, the deviation at least MIN_LOG_SIGMA, gaps under 1 s as 1 s); ``E(T) = write(T) d
+ n ((1 - p) READ + p write(T))``; the cheapest split into 1h then 5m, ties to 5m; fewer than
MIN_SAMPLES gaps: all 5m; gaps kept per kind of the request before them (tool result or user),
a kind's own gaps when it has MIN_SAMPLES, else all; memory rounded to 0.1 s, the newest
MAX_GAPS per kind. Numbers worked by hand with clean logs (e^k gaps).
"""

from __future__ import annotations

import math

import pytest

from prefixgate.rewriter.analysis.ttl_choice import (
    MAX_GAPS,
    MIN_LOG_SIGMA,
    plan,
    request_kind,
    samples,
    segment_cost,
    tail,
    updated,
)
from prefixgate.rewriter.wire.ir import Block, Message, Prompt

E = math.e


def prompt(*msgs: Message) -> Prompt:
    return Prompt(api="anthropic", tools=None, system=(), messages=msgs, params={}, key_order=())  # type: ignore[arg-type]


def msg(role: str, *types: str) -> Message:
    return Message(role=role, blocks=tuple(Block(t, {"type": t}) for t in types), form="list")


def test_request_kind() -> None:
    assert request_kind(prompt()) == "user"
    assert request_kind(prompt(msg("user", "text"))) == "user"
    assert request_kind(prompt(msg("tool", "text"))) == "tool"
    assert request_kind(prompt(msg("user", "text", "tool_result"))) == "tool"
    assert request_kind(prompt(msg("user", "tool_result"), msg("user", "text"))) == "user"  # the newest decides


def test_tail_uses_the_sample_deviation_and_its_floor() -> None:
    """gaps e^1, e^3: mu 2, sample variance ((1)^2 + (1)^2) / (2 - 1) = 2, sigma sqrt 2:
    p(e^2) = 0.5; p(e^(2 + sqrt 2)) = one sigma above = 0.5 erfc(1 / sqrt 2) = 0.158655."""
    assert tail([E, E ** 3], E ** 2) == pytest.approx(0.5, rel=1e-12)
    assert tail([E, E ** 3], E ** (2 + math.sqrt(2))) == pytest.approx(0.5 * math.erfc(1 / math.sqrt(2)), rel=1e-9)
    # equal gaps: sigma floors at 0.25: one floor-sigma above the median
    assert MIN_LOG_SIGMA == 0.25
    assert tail([E ** 4] * 3, E ** 4.25) == pytest.approx(0.5 * math.erfc(1 / math.sqrt(2)), rel=1e-9)
    assert tail([E ** 4] * 3, E ** 4) == pytest.approx(0.5, rel=1e-12)
    # gaps under 1 s count as 1 s (log 0): the median is 1 s
    assert tail([0.2, 0.5, 0.9], 1.0) == pytest.approx(0.5, rel=1e-12)
    assert tail([E ** 2, E ** 2, E ** 5], E ** 3) == pytest.approx(
        0.5 * math.erfc((3 - 3) / (math.sqrt(3) * math.sqrt(2))), rel=1e-9)  # mu 3, var (1+1+4)/2 = 3


def test_segment_cost_formula_by_hand() -> None:
    """Median gap 300 s = the 5m TTL: p = 0.5 -> 5m: 1.25 * 40 + 100 * (0.5 * 0.1 + 0.5 * 1.25) = 117.5."""
    gaps = [300.0, 300.0, 300.0]
    assert segment_cost("5m", 100, 40, gaps) == pytest.approx(117.5, rel=1e-9)
    g1h = [3600.0] * 3
    assert segment_cost("1h", 100, 40, g1h) == pytest.approx(2.0 * 40 + 100 * (0.5 * 0.1 + 0.5 * 2.0), rel=1e-9)


def test_plan_edges_and_reasons() -> None:
    assert plan([], [30.0] * 5) == ([], "ttl 5m: 5 gap(s) measured")
    assert plan([(10, 10)], [30.0, 30.0]) == (["5m"], "ttl 5m: 2 gap(s) measured")
    ttls, why = plan([(100, 0), (50, 50)], [30.0] * 3)
    assert ttls == ["5m", "5m"]
    c5 = segment_cost("5m", 100, 0, [30.0] * 3) + segment_cost("5m", 50, 50, [30.0] * 3)
    c1 = segment_cost("1h", 100, 0, [30.0] * 3) + segment_cost("1h", 50, 50, [30.0] * 3)
    assert why == f"ttl 0 x 1h then 2 x 5m: expected cost {c5:.0f} vs all-5m {c5:.0f}, all-1h {c1:.0f} over 3 gaps"


def test_ties_go_to_5m() -> None:
    """A segment of 0 tokens costs 0 either way: a tie, so 5m."""
    assert plan([(0, 0)], [1000.0] * 3)[0] == ["5m"]
    assert plan([(1000, 0), (0, 0)], [1000.0] * 3)[0] == ["1h", "5m"]


def test_samples_own_kind_then_pooled() -> None:
    mem = {"g": {"tool": [1.0, 2.0, 3.0], "user": [100.0]}}
    assert samples(mem, "tool") == [1.0, 2.0, 3.0]
    assert samples(mem, "user") == [1.0, 2.0, 3.0, 100.0]  # too few of its own: all of them
    assert samples({"g": {"tool": [1.0], "user": [2.0]}}, "user") == []  # 2 in all: too few
    assert samples({"g": {"tool": [1, "x", 2.5, None, 3]}}, "tool") == [1.0, 2.5, 3.0]
    assert samples({"g": "junk"}, "tool") == [] and samples(None, "tool") == []
    assert samples({"g": {"user": [5.0, 6.0, 7.0]}}, "user") == [5.0, 6.0, 7.0]


def test_updated_files_the_gap_under_the_previous_kind() -> None:
    mem = updated(None, 10.0, "tool")
    assert mem == {"t": 10.0, "k": "tool", "g": {"tool": [], "user": []}}
    mem = updated(mem, 12.34, "user")
    assert mem == {"t": 12.34, "k": "user", "g": {"tool": [2.3], "user": []}}
    mem = updated(mem, 12.34, "user")  # the same instant: a gap of 0 is a gap
    assert mem["g"]["user"] == [0.0]
    assert updated({"t": 1.0, "k": "robot", "g": {}}, 5.0, "user")["g"] == {"tool": [], "user": []}
    assert updated({"t": "x", "k": "user", "g": {}}, 5.0, "user")["g"] == {"tool": [], "user": []}
    full = {"t": 0.0, "k": "user", "g": {"user": [float(i) for i in range(MAX_GAPS)], "tool": ["bad", 1]}}
    new = updated(full, 99.0, "user")
    assert new["g"]["user"] == [float(i) for i in range(1, MAX_GAPS)] + [99.0]
    assert new["g"]["tool"] == [1.0]


def test_the_reason_quotes_the_chosen_all_5m_and_all_1h_costs() -> None:
    """Two segments: all-5m = E5(a) + E5(b), all-1h = E1(a) + E1(b), the 1h-then-5m split
    E1(a) + E5(b) (25106) is neither; the cheapest here is all-5m."""
    g = [10.0, 400.0, 2000.0, 30.0]
    segs = [(10000, 10000), (5000, 0)]
    c5 = [segment_cost("5m", n, d, g) for n, d in segs]
    c1 = [segment_cost("1h", n, d, g) for n, d in segs]
    assert round(sum(c5)) == 20170 and round(sum(c1)) == 23824 and round(c1[0] + c5[1]) == 25106
    assert plan(segs, g) == (["5m", "5m"], "ttl 0 x 1h then 2 x 5m: expected cost 20170 vs all-5m "
                                           "20170, all-1h 23824 over 4 gaps")


def test_exactly_min_samples_pooled_gaps_decide() -> None:
    """Own kind short (2 gaps), pooled exactly MIN_SAMPLES (3): the pooled gaps are used."""
    mem = {"g": {"tool": [1.0, 2.0], "user": [5.0]}}
    assert samples(mem, "tool") == [1.0, 2.0, 5.0]
    assert samples({"g": {"tool": [1.0], "user": [5.0]}}, "tool") == []
