"""The token-id radix counterfactual: hand-computed cases, eviction, bounds, invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.provider_models.token_radix import (
    TokenCaches,
    TokenRadix,
    common_prefix,
    engine_cached_tokens,
)


def test_common_prefix_hand_cases() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0


def test_session_of_growing_prompts_hand_computed() -> None:
    caches = TokenCaches()
    # turn 1: cold
    assert caches.process("s", [1, 2, 3, 4, 5]).cached_read_tokens == 0
    # turn 2 repeats turn 1 and grows: all 5 ids of turn 1 match
    out = caches.process("s", [1, 2, 3, 4, 5, 6, 7, 8])
    assert (out.input_tokens, out.cached_read_tokens, out.uncached_tokens) == (8, 5, 3)
    # turn 3 diverges at position 3 (a volatile clock): 3 ids match
    assert caches.process("s", [1, 2, 3, 9, 9, 9]).cached_read_tokens == 3
    # the same prompt again: all but the last id (the engine computes one token for logits)
    assert caches.process("s", [1, 2, 3, 9, 9, 9]).cached_read_tokens == 5
    # both branches are still stored
    assert caches.process("s", [1, 2, 3, 4, 5, 6, 7, 8, 0]).cached_read_tokens == 8


def test_keys_are_isolated() -> None:
    caches = TokenCaches()
    caches.process("a", [1, 2, 3, 4])
    assert caches.process("b", [1, 2, 3, 4]).cached_read_tokens == 0
    assert caches.process("a", [1, 2, 3, 4]).cached_read_tokens == 3


def test_page_size_rounds_down() -> None:
    tree = TokenRadix()
    tree.insert(list(range(40)))
    assert engine_cached_tokens(tree, list(range(40)) + [99], page_size=16) == 32
    assert engine_cached_tokens(tree, list(range(40)) + [99], page_size=1) == 40
    assert engine_cached_tokens(tree, [7]) == 0  # one id: nothing can be reused


def test_split_keeps_both_branches_and_exact_counts() -> None:
    tree = TokenRadix()
    assert tree.insert([1, 2, 3, 4]) == 4
    assert tree.insert([1, 2, 7]) == 1     # split at 2, one new id
    assert tree.insert([1, 2]) == 0        # a prefix already stored
    assert tree.total_tokens == 5
    tree.check()
    assert tree.match([1, 2, 3, 4, 5]) == 4 and tree.match([1, 2, 7]) == 3


def test_lru_eviction_drops_the_least_recent_branch() -> None:
    tree = TokenRadix(capacity_tokens=10)
    tree.insert([0, 1, 2, 3])          # a: 4 ids
    tree.insert([0, 5, 6, 7])          # b: shares [0], 3 more -> 7
    tree.match([0, 1, 2, 3])           # a is now more recent than b
    tree.insert([8, 9, 10, 11])        # c: 11 > 10 -> b's leaf (3 ids) goes
    tree.check()
    assert tree.total_tokens == 8
    assert tree.match([0, 5, 6, 7]) == 1 and tree.match([0, 1, 2, 3]) == 4
    assert tree.match([8, 9, 10, 11]) == 4


def test_the_request_just_inserted_is_never_evicted() -> None:
    tree = TokenRadix(capacity_tokens=4)
    tree.insert([1, 2, 3])
    tree.insert([4, 5, 6, 7, 8, 9])    # larger than capacity alone: kept, the other goes
    assert tree.match([4, 5, 6, 7, 8, 9]) == 6 and tree.match([1, 2, 3]) == 0


def test_memory_bounds_drop_least_recent_keys() -> None:
    caches = TokenCaches(max_keys=2)
    for k in "abc":
        caches.process(k, [1, 2, 3])
    assert len(caches) == 2 and caches.process("a", [1, 2, 3]).cached_read_tokens == 0
    small = TokenCaches(total_tokens=10)
    small.process("x", list(range(8)))
    small.process("y", list(range(8)))  # 16 > 10: x goes whole
    assert len(small) == 1 and small.stored_tokens() == 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=12), min_size=1, max_size=12))
def test_match_equals_longest_common_prefix_with_any_stored_prompt(
        prompts: list[list[int]]) -> None:
    tree = TokenRadix(capacity_tokens=10_000)  # no eviction: everything inserted stays
    stored: list[list[int]] = []
    for p in prompts:
        expected = max((common_prefix(p, q) for q in stored), default=0)
        assert tree.match(p) == expected
        tree.insert(p)
        stored.append(p)
        tree.check()
