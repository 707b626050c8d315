"""The guard's sequential test (prefixgate/cache/guard/sequential.py): the issue's scripted
upstreams get their verdicts at the looks the rule promises, the margin's edges are strict, and
the verdict moves the right way with the counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.guard.sequential import PairCounts, TestRule, decide, look_alphas, tango_statistic

RULE = TestRule()


def counts(pairs: int, move_only: int, floor_only: int, both: int = 0) -> PairCounts:
    return PairCounts(pairs, move_only + both, floor_only + both, both)


def test_an_unaffected_upstream_is_turned_on_at_the_third_look() -> None:
    assert [decide(counts(n, 0, 0), RULE).state for n in (20, 40)] == ["trialling", "trialling"]
    d = decide(counts(60, 0, 0), RULE)
    assert d.state == "on" and d.upper < RULE.margin and "look 3/10" in d.reason


@pytest.mark.parametrize("move_only", [10, 12, 20])  # engine ~50 %, affected 60 % .. 100 %
def test_an_affected_upstream_is_turned_off_at_the_first_look(move_only: int) -> None:
    d = decide(counts(20, move_only, 0), RULE)
    assert d.state == "off" and d.lower > 0 and "worse than the floor" in d.reason
    assert d.move_rate == move_only / 20 and d.floor_rate == 0


def test_a_nondeterministic_upstream_with_typical_counts_ends_on_not_off() -> None:
    # p = 0.25 flips per answer: each rate 0.375, half of the changed pairs shared (both 0.1875)
    states = [decide(counts(n, 3 * n // 16, 3 * n // 16, 3 * n // 16), RULE).state
              for n in range(20, 220, 20)]
    first_on = states.index("on")
    assert states[:first_on] == ["trialling"] * first_on and 1 < first_on < 10
    assert decide(counts(200, 37, 37, 38), RULE).state == "on"


def test_at_max_pairs_an_unproven_move_is_off_and_says_so() -> None:
    d = decide(counts(200, 50, 34), RULE)  # excess 0.08: neither proven harmless nor worse
    assert d.state == "off" and d.reason.startswith("not proven within 200 pairs")
    assert decide(counts(180, 45, 31), RULE).state == "trialling"


def test_alpha_is_spent_late_for_on_and_evenly_for_off() -> None:
    interim, final = look_alphas(RULE, 1), look_alphas(RULE, 10)
    assert interim[0] == pytest.approx(0.001) and final[0] == pytest.approx(0.041)
    assert interim[1] == final[1] == pytest.approx(0.005)
    total_on = sum(look_alphas(RULE, k)[0] for k in range(1, 11))
    assert total_on == pytest.approx(0.05)


def test_on_needs_the_upper_bound_strictly_below_the_margin() -> None:
    # one look, confidence 0.5: z = 0, so "on" iff the estimate < margin; here it equals it
    rule = TestRule(margin=0.25, confidence=0.5, look_every=20, max_pairs=20)
    assert tango_statistic(20, 5, 0, 0.25) == 0.0
    assert decide(counts(20, 5, 0), rule).state == "off"
    assert decide(counts(20, 4, 0), rule).state == "on"


def test_off_needs_the_estimate_strictly_above_half_the_margin() -> None:
    # two looks, confidence 0.5: at look 1 z_on = 2.33, z_off = 0.67; estimate 0.25 = margin / 2
    rule = TestRule(margin=0.5, confidence=0.5, look_every=20, max_pairs=40)
    d = decide(counts(20, 5, 0), rule)
    assert d.state == "trialling" and d.lower > 0
    assert decide(counts(20, 6, 0), rule).state == "off"


def test_bad_rules_and_counts_are_refused() -> None:
    for kw in ({"margin": 0.0}, {"confidence": 1.0}, {"look_every": 0}, {"max_pairs": 10}):
        with pytest.raises(ValueError):
            TestRule(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decide(PairCounts(20, 3, 3, 4), RULE)  # both > move
    with pytest.raises(ValueError):
        decide(PairCounts(20, 15, 15, 5), RULE)  # 10 + 10 + 5 > 20


@st.composite
def look_counts(draw: st.DrawFn) -> PairCounts:
    n = 20 * draw(st.integers(1, 10))
    both = draw(st.integers(0, n))
    move_only = draw(st.integers(0, n - both))
    floor_only = draw(st.integers(0, n - both - move_only))
    return counts(n, move_only, floor_only, both)


@settings(max_examples=300, deadline=None)
@given(look_counts())
def test_more_move_changes_never_turn_off_into_on(c: PairCounts) -> None:
    neither = c.pairs - c.move_changed - c.floor_changed + c.both_changed
    if neither == 0:
        return
    worse = PairCounts(c.pairs, c.move_changed + 1, c.floor_changed, c.both_changed)
    before, after = decide(c, RULE).state, decide(worse, RULE).state
    assert not (before == "off" and after != "off")
    assert not (after == "on" and before != "on")
    better_floor = PairCounts(c.pairs, c.move_changed, c.floor_changed + 1, c.both_changed)
    assert not (decide(c, RULE).state == "on" and decide(better_floor, RULE).state != "on")


@settings(max_examples=300, deadline=None)
@given(look_counts())
def test_swapping_move_and_floor_mirrors_the_test(c: PairCounts) -> None:
    swapped = PairCounts(c.pairs, c.floor_changed, c.move_changed, c.both_changed)
    a, b = decide(c, RULE), decide(swapped, RULE)
    assert (a.move_rate, a.floor_rate) == (b.floor_rate, b.move_rate)
    assert not (a.state == "off" and b.state == "off" and "worse" in a.reason + b.reason)
    if c.move_changed == c.floor_changed:
        assert "worse than the floor" not in a.reason
    mo, fo = c.move_changed - c.both_changed, c.floor_changed - c.both_changed
    for delta in (0.0, 0.15, -0.3):
        assert tango_statistic(c.pairs, mo, fo, delta) == pytest.approx(
            -tango_statistic(c.pairs, fo, mo, -delta), abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 199), st.data())
def test_no_verdict_but_at_a_look(n: int, data: st.DataObject) -> None:
    both = data.draw(st.integers(0, n))
    move_only = data.draw(st.integers(0, n - both))
    c = counts(n, move_only, 0, both)
    if n % 20:
        assert decide(c, RULE).state == "trialling"
    if n < 20:
        d = decide(c, RULE)
        assert d.state == "trialling" and d.reason.endswith("next look at 20")


def test_a_move_surely_worse_but_within_the_margin_is_on() -> None:
    # 8 % of answers changed, floor 0: worse than the floor at 0.95 AND below the margin: "on"
    d = decide(counts(200, 16, 0), RULE)
    assert d.lower > 0 and d.upper < RULE.margin and d.state == "on"
