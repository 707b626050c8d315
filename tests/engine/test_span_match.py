"""The span aligner: re-aligns a prompt with a cached run across short changed spans, within the gate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.kv.span_match import SpanBounds, SpanPlan, align, value_like_tokens, values_only

B = SpanBounds(max_spans=4, max_span_tokens=48, min_anchor_tokens=16)


def old_run(n: int = 300, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


def assert_sound(plan: SpanPlan, new: list[int], old: list[int], b: SpanBounds) -> None:
    """Every property the engine relies on: runs equal on both sides, ordered and disjoint, long
    enough, the windows between them within the bounds and exactly the gaps."""
    assert len(plan.spans) <= b.max_spans
    i = o = 0
    spans = iter(plan.spans)
    for r in plan.runs:
        assert r.length >= b.min_anchor_tokens
        assert new[r.new_start:r.new_start + r.length] == old[r.old_start:r.old_start + r.length]
        assert r.new_start >= i and r.old_start >= o
        if r.new_start > i or r.old_start > o:
            assert next(spans) == (i, r.new_start, o, r.old_start)
            assert r.new_start - i <= b.max_span_tokens and r.old_start - o <= b.max_span_tokens
        assert r.shift == r.new_start - r.old_start
        i, o = r.new_start + r.length, r.old_start + r.length
    assert next(spans, None) is None
    assert plan.end == i and plan.reused_tokens == sum(r.length for r in plan.runs)


def test_a_changed_clock_token_at_the_very_start_reuses_the_rest_unshifted() -> None:
    old = old_run()
    new = [5] + old[1:]
    plan = align(new, old, B)
    assert plan is not None
    assert [(r.new_start, r.old_start, r.length) for r in plan.runs] == [(1, 1, 299)]
    assert plan.spans == ((0, 1, 0, 1),) and plan.runs[0].shift == 0


def test_a_span_that_tokenized_longer_shifts_the_run_after_it() -> None:
    old = old_run()
    new = [7, 8, 9, 10] + old[2:]  # 2 tokens became 4
    plan = align(new, old, B)
    assert plan is not None and plan.runs[0].shift == 2 and plan.reused_tokens == 298
    assert_sound(plan, new, old, B)


def test_a_200_token_changed_span_is_refused() -> None:
    old = old_run()
    new = list(range(5000, 5200)) + old[200:]
    assert align(new, old, B) is None


def test_many_small_spans_are_reused_up_to_max_spans_and_the_rest_is_tail() -> None:
    old = old_run(400)
    new = list(old)
    for k in range(8):  # a changed token every 40 tokens
        new[k * 40] = 7 + k
    plan = align(new, old, B)
    assert plan is not None and len(plan.spans) == 4 and len(plan.runs) == 4
    assert plan.end == 4 * 40  # the 5th changed token starts the fresh tail
    assert_sound(plan, new, old, B)


def test_a_changed_span_right_before_the_end_is_left_to_the_tail() -> None:
    old = old_run()
    new = [1] + old[1:-3] + [2, 3]
    plan = align(new, old, B)
    assert plan is not None and plan.end == len(old) - 3
    assert_sound(plan, new, old, B)


def test_a_run_shorter_than_the_anchor_is_not_reused() -> None:
    old = old_run()
    new = [1] + old[1:11] + [2] + old[12:]  # 10 equal tokens between two changes
    plan = align(new, old, B)
    assert plan is not None and plan.runs[0].new_start == 12  # the 10 are part of the span
    assert plan.spans == ((0, 12, 0, 12),)


def test_no_plan_when_nothing_re_aligns_or_the_prompt_is_short() -> None:
    assert align(list(range(10, 60)), old_run(), B) is None
    assert align(old_run(10), old_run(10), B) is None  # shorter than one anchor


def test_bounds_must_be_positive() -> None:
    import pytest

    with pytest.raises(ValueError):
        SpanBounds(max_spans=0)


edits = st.lists(st.tuples(st.integers(0, 399), st.integers(0, 70), st.integers(0, 70)),
                 max_size=8)


@settings(max_examples=150, deadline=None)
@given(edits=edits, alphabet=st.sampled_from([4, 50, 100000]),
       bounds=st.builds(SpanBounds, st.integers(1, 5), st.integers(1, 60), st.integers(1, 24)),
       seed=st.integers(0, 2 ** 16))
def test_any_plan_stays_within_the_gate_and_reuses_only_equal_tokens(
        edits: list[tuple[int, int, int]], alphabet: int, bounds: SpanBounds, seed: int) -> None:
    import random

    rng = random.Random(seed)
    old = [rng.randrange(alphabet) for _ in range(400)]
    new = list(old)
    for pos, cut, ins in sorted(edits, reverse=True):  # replace old[pos:pos+cut] by ins tokens
        new[pos:pos + cut] = [rng.randrange(alphabet) for _ in range(ins)]
    plan = align(new, old, bounds)
    if plan is not None:
        assert_sound(plan, new, old, bounds)


def test_value_like_pieces_are_digits_hex_and_separators() -> None:
    pieces = ["12", ":", "Ġ15", "be", "Ċ", "-", "ĠEST", "Request", "_", None, "", "\u25813f"]
    assert value_like_tokens(pieces) == frozenset({0, 1, 2, 3, 4, 5, 8, 11})


def test_the_content_gate_looks_only_at_the_tokens_that_differ() -> None:
    ok = frozenset(range(0, 10)).__contains__  # "digits"
    assert values_only([1, 2, 500, 501, 3], [1, 4, 500, 501, 7, 8], ok)  # words equal inside
    assert not values_only([1, 600], [1, 601], ok)                     # a word changed
    assert not values_only([], [600, 601], ok)                         # a line of words inserted
    old = old_run()
    new = [5] + old[1:]
    assert align(new, old, B, ok) is None            # token 1000 -> 5: 1000 is not changeable
    assert align(new, old, B, lambda t: True) is not None
