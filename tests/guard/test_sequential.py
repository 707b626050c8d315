"""The guard's sequential test (prefixgate/cache/guard/sequential.py): the issue's scripted
upstreams get their verdicts at the looks the rule promises, the margin's edges are strict, and
the verdict moves the right way with the counts."""

from __future__ import annotations

import math
from statistics import NormalDist

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


# --- the statistic against an independent computation; the bounds it gives -------------------

_ND = NormalDist()


def reference_tango(n: int, b: int, c: int, delta0: float) -> float:
    """Tango's statistic computed apart from the module: the restricted MLE of ``p_c`` found by
    bisecting the derivative of the profile log-likelihood
    ``b log(p + delta0) + c log p + (n - b - c) log(1 - 2 p - delta0)`` (concave in ``p``) over
    ``p`` in ``(max(0, -delta0), (1 - delta0) / 2)``, then ``(b - c - n delta0) / sqrt(n var)``
    with ``var = p_b + p_c - delta0 ** 2``."""
    lo, hi = max(0.0, -delta0), (1.0 - delta0) / 2.0
    for _ in range(200):
        p = (lo + hi) / 2.0
        slope = (b / (p + delta0) if b else 0.0) + (c / p if c else 0.0) \
            - (2.0 * (n - b - c) / (1.0 - 2.0 * p - delta0) if n - b - c else 0.0)
        lo, hi = (p, hi) if slope > 0 else (lo, p)
    p = (lo + hi) / 2.0
    return (b - c - n * delta0) / math.sqrt(n * (2.0 * p + delta0 - delta0 * delta0))


@st.composite
def table_and_delta(draw: st.DrawFn) -> tuple[int, int, int, float]:
    n = draw(st.integers(1, 200))
    b = draw(st.integers(0, n))
    c = draw(st.integers(0, n - b))
    delta0 = draw(st.floats(-0.99, 0.99).filter(lambda x: abs(x) > 1e-6))
    return n, b, c, delta0


@pytest.mark.parametrize(("n", "b", "c", "delta0"), [
    (20, 0, 0, 0.01), (1, 0, 0, 0.3), (20, 0, 0, -0.01), (20, 1, 0, 0.02), (3, 0, 1, 0.1),
    (20, 5, 0, 0.25), (200, 37, 37, 0.15), (60, 0, 0, 0.15), (20, 0, 20, -0.5), (20, 20, 0, 0.9)])
def test_tango_statistic_matches_an_independent_restricted_mle(n: int, b: int, c: int,
                                                               delta0: float) -> None:
    assert tango_statistic(n, b, c, delta0) == pytest.approx(reference_tango(n, b, c, delta0),
                                                             rel=1e-6, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(table_and_delta())
def test_tango_statistic_matches_an_independent_restricted_mle_everywhere(
        t: tuple[int, int, int, float]) -> None:
    n, b, c, delta0 = t
    assert tango_statistic(n, b, c, delta0) == pytest.approx(reference_tango(n, b, c, delta0),
                                                             rel=1e-6, abs=1e-6)
    if b + c:  # at delta0 = 0 it is McNemar's statistic
        assert tango_statistic(n, b, c, 0.0) == pytest.approx((b - c) / math.sqrt(b + c), rel=1e-12)
    else:
        assert tango_statistic(n, b, c, 0.0) == 0.0


@pytest.mark.parametrize(("b", "c"), [(3, 1), (0, 0), (19, 0), (0, 20)])
def test_a_difference_of_one_is_refuted_by_any_pair_not_changed_by_the_move_alone(b: int, c: int) -> None:
    # d = 1 means every pair is move-only (d = -1: floor-only); one pair otherwise refutes it outright
    assert tango_statistic(20, b, c, 1.0) == -math.inf
    assert tango_statistic(20, c, b, -1.0) == math.inf
    assert tango_statistic(20, 20, 0, 1.0) == tango_statistic(20, 0, 20, -1.0) == 0.0


def look_levels(rule: TestRule, look: int) -> tuple[float, float]:
    """``(z_on, z_off)`` at look ``look``, from the alphas :func:`look_alphas` spends."""
    alpha_on, alpha_off = look_alphas(rule, look)
    return _ND.inv_cdf(1.0 - alpha_on), _ND.inv_cdf(1.0 - alpha_off)


def assert_is_root(n: int, b: int, c: int, bound: float, target: float) -> None:
    """``bound`` is where Tango's statistic (decreasing in delta0) crosses ``target``: above it
    just below ``bound``, at most it just above, within (-1, 1) and up to 1e-7."""
    assert -1.0 <= bound <= 1.0
    if bound - 1e-7 > -1.0:
        assert reference_tango(n, b, c, bound - 1e-7) > target
    if bound + 1e-7 < 1.0:
        assert reference_tango(n, b, c, bound + 1e-7) < target


@settings(max_examples=200, deadline=None)
@given(look_counts())
def test_the_bounds_are_the_score_interval_at_this_looks_levels(c: PairCounts) -> None:
    d = decide(c, RULE)
    b, f = c.move_changed - c.both_changed, c.floor_changed - c.both_changed
    z_on, z_off = look_levels(RULE, c.pairs // RULE.look_every)
    assert d.pairs == c.pairs
    assert_is_root(c.pairs, b, f, d.upper, -z_on)
    assert_is_root(c.pairs, b, f, d.lower, z_off)
    assert (d.state == "on") == (d.upper < RULE.margin)
    assert ("worse than the floor" in d.reason) == (d.lower > 0 and (b - f) / c.pairs > RULE.margin / 2)


@pytest.mark.parametrize(("c", "state", "why"), [
    (counts(60, 0, 0), "on", "excess over the floor below"),
    (counts(20, 12, 0), "off", "worse than the floor"),
    (counts(200, 50, 34), "off", "not proven within 200 pairs"),
    (counts(180, 45, 31), "trialling", "undecided at look 9/10"),
    (counts(20, 0, 20), "on", "excess over the floor below"),
    (counts(20, 20, 0), "off", "worse than the floor")])
def test_every_verdict_reports_its_pairs_and_score_bounds(c: PairCounts, state: str, why: str) -> None:
    d = decide(c, RULE)
    b, f = c.move_changed - c.both_changed, c.floor_changed - c.both_changed
    z_on, z_off = look_levels(RULE, c.pairs // RULE.look_every)
    assert (d.state, d.pairs) == (state, c.pairs) and why in d.reason
    assert_is_root(c.pairs, b, f, d.upper, -z_on)
    assert_is_root(c.pairs, b, f, d.lower, z_off)
    assert d.lower < d.upper


@pytest.mark.parametrize(("n", "next_look"), [(0, 20), (1, 20), (19, 20), (21, 40), (39, 40), (199, 200)])
def test_between_looks_the_decision_has_no_bounds_and_says_when_the_next_look_is(n: int, next_look: int) -> None:
    c = counts(n, n // 2, n // 4, n // 5)
    d = decide(c, RULE)
    assert (d.state, d.pairs, d.upper, d.lower) == ("trialling", n, 1.0, -1.0)
    assert d.reason == f"{n} pairs; next look at {next_look}"
    rates = (c.move_changed / n, c.floor_changed / n) if n else (0.0, 0.0)  # no pair: nothing changed
    assert (d.move_rate, d.floor_rate) == rates


# --- the rule's edges: spending for many looks, a short last look, the strict off test ---------

@pytest.mark.parametrize(("max_pairs", "interim"), [(130, 0.05 / 50), (140, 0.05 / 52), (200, 0.05 / 76)])
def test_with_many_looks_each_interim_look_spends_alpha_over_four_looks_less_one(
        max_pairs: int, interim: float) -> None:
    # a look every 10 pairs: K = 13, 14, 20; max(50, 4 (K - 1)) = 50, 52, 76; the last look the rest
    rule = TestRule(look_every=10, max_pairs=max_pairs)
    k = rule.looks
    assert all(look_alphas(rule, look)[0] == pytest.approx(interim) for look in range(1, k))
    assert look_alphas(rule, k)[0] == pytest.approx(0.05 - (k - 1) * interim)
    assert look_alphas(rule, k)[1] == pytest.approx(0.05 / k)


def test_a_last_look_off_the_schedule_spends_the_last_looks_alpha() -> None:
    # looks at 20, 40 and 50 (K = 3): at 50 the on-test spends 0.048 (z 1.66), not 0.001 (z 3.09)
    rule = TestRule(look_every=20, max_pairs=50)
    assert tango_statistic(50, 0, 0, 0.15) == pytest.approx(-2.97, abs=0.01)
    d = decide(counts(50, 0, 0), rule)
    assert d.state == "on" and "look 3/3" in d.reason
    assert decide(counts(40, 0, 0), rule).state == "trialling"
    late = decide(counts(220, 0, 0, 220), RULE)  # past max_pairs it is still the last look
    assert late.state == "on" and "look 10/10" in late.reason


@pytest.mark.parametrize(("z", "margin", "b", "f"), [(2.0, 0.3, 4, 0), (1.0, 0.15, 3, 1)])
def test_off_needs_the_statistic_strictly_above_the_off_level(z: float, margin: float, b: int, f: int) -> None:
    # two looks and confidence 1 - 2 (1 - Phi(z)): the first look's off level is exactly z, and
    # McNemar's statistic (b - f) / sqrt(b + f) is exactly z too; one more move change is above it
    rule = TestRule(margin=margin, confidence=1.0 - 2.0 * _ND.cdf(-z), look_every=20, max_pairs=40)
    assert look_levels(rule, 1)[1] == z and tango_statistic(20, b, f, 0.0) == z
    assert (b - f) / 20 > margin / 2
    assert decide(counts(20, b, f), rule).state == "trialling"
    assert decide(counts(20, b + 1, f), rule).state == "off"


@pytest.mark.parametrize("floor_only", [1, 2, 3, 4])
def test_off_reads_the_excess_over_the_floor_not_the_changes_of_both(floor_only: int) -> None:
    # 160 pairs (look 8): b - f = 12 is an estimate of exactly margin / 2 = 0.075; the off-test's
    # statistic 12 / sqrt(12 + 2 f) > 2.576 already rejects d <= 0, yet the move keeps trialling
    d = decide(counts(160, 12 + floor_only, floor_only), RULE)
    assert d.state == "trialling" and d.lower > 0
    assert decide(counts(160, 13 + floor_only, floor_only), RULE).state == "off"


def test_the_rules_edges_are_where_the_docstring_puts_them() -> None:
    for kw, msg in (({"margin": 1.0}, "margin must be in"), ({"margin": 1.5}, "margin must be in"),
                    ({"margin": 0.0}, "margin must be in"), ({"confidence": 0.0}, "confidence must be in"),
                    ({"confidence": 1.0}, "confidence must be in"), ({"look_every": 0}, "need 1 <= look_every"),
                    ({"max_pairs": 19}, "need 1 <= look_every")):
        with pytest.raises(ValueError, match=msg):
            TestRule(**kw)  # type: ignore[arg-type]
    rule = TestRule(margin=0.999, confidence=0.001, look_every=1, max_pairs=1)
    assert rule.looks == 1 and TestRule(look_every=1).looks == 200


@pytest.mark.parametrize("bad", [
    PairCounts(20, 0, 0, -1),  # both < 0
    PairCounts(20, 1, 3, 2),  # move-only < 0
    PairCounts(20, 3, 1, 2),  # floor-only < 0
    PairCounts(-1, 0, 0, 0),  # pairs < 0
    PairCounts(20, 15, 15, 5)])  # 10 + 10 + 5 > 20
def test_each_inconsistent_count_is_refused(bad: PairCounts) -> None:
    with pytest.raises(ValueError, match="inconsistent pair counts"):
        decide(bad, RULE)
