"""The token radix counterfactual pinned point by point (issue 21):
:mod:`prefixgate.cache.provider_models.token_radix`.

Source: its module docstring — matched on all but the last token, rounded down to
``page_size``; the whole prompt then stored; over ``capacity_tokens`` the least recently used
leaves go first (a match or an insert makes a node recent), the path just inserted is kept, and
a parent left without children goes the same way unless it is on that path; per key one tree,
at most ``max_keys`` keys and ``total_tokens`` ids (least recently used keys dropped whole, the
key just used kept). Hand-computed trees.
"""

from __future__ import annotations

import pytest

from prefixgate.cache.provider_models.token_radix import (
    TokenCaches,
    TokenRadix,
    common_prefix,
    engine_cached_tokens,
)


def test_common_prefix_edges() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [6]) == 0
    assert common_prefix([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8]) == 6
    assert common_prefix([1, 9, 3, 4], [1, 2, 3, 4]) == 1


def test_a_match_makes_a_branch_recent_lru_not_fifo() -> None:
    """a (3 ids) then b (3 ids), capacity 6; a matched: b is now the least recent; c (2 ids)
    -> 8 > 6: b goes (FIFO would drop a)."""
    t = TokenRadix(capacity_tokens=6)
    t.insert([1, 2, 3])
    t.insert([4, 5, 6])
    assert t.match([1, 2, 3]) == 3
    t.insert([7, 8])
    t.check()
    assert (t.match([1, 2, 3]), t.match([4, 5, 6]), t.total_tokens) == (3, 0, 5)


def test_a_partial_match_touches_the_node_it_enters() -> None:
    t = TokenRadix(capacity_tokens=6)
    t.insert([1, 2, 3])
    t.insert([4, 5, 6])
    assert t.match([1, 9]) == 1  # enters a's node: a is recent
    t.insert([7, 8])
    assert t.match([1, 2, 3]) == 3 and t.match([4, 5, 6]) == 0


def test_an_insert_makes_its_path_recent() -> None:
    t = TokenRadix(capacity_tokens=6)
    t.insert([1, 2, 3])
    t.insert([4, 5, 6])
    assert t.insert([1, 2, 3]) == 0  # nothing new; a recent again
    t.insert([7, 8])
    assert t.match([1, 2, 3]) == 3 and t.match([4, 5, 6]) == 0


def test_insert_returns_the_ids_newly_stored_and_splits_exactly() -> None:
    t = TokenRadix(capacity_tokens=100)
    assert t.insert([1, 2, 3, 4]) == 4
    assert t.insert([1, 2, 5, 6, 7]) == 3  # split at 2: [1, 2] -> [3, 4] and [5, 6, 7]
    t.check()
    assert t.total_tokens == 7
    assert set(t._root.children) == {1} and set(t._root.children[1].children) == {3, 5}
    assert list(t._root.children[1].key) == [1, 2]
    assert t.insert([1, 2]) == 0 and t.total_tokens == 7


def test_a_childless_parent_on_the_kept_path_stays() -> None:
    """[1, 2, 3, 4] stored (capacity 1, kept as the path just inserted); [1, 2] inserted: split,
    the path is [1, 2]; 4 > 1: leaf [3, 4] goes; [1, 2] is childless but on the path: kept."""
    t = TokenRadix(capacity_tokens=1)
    t.insert([1, 2, 3, 4])
    assert t.total_tokens == 4  # over capacity, but the request just inserted is kept
    t.insert([1, 2])
    t.check()
    assert (t.total_tokens, t.match([1, 2, 3, 4])) == (2, 2)


def test_a_childless_parent_off_the_path_goes_too() -> None:
    """[1, 2, 3] and [1, 2, 4] share [1, 2]; inserting [9] at capacity 1 drops both leaves,
    then their parent [1, 2] (now a leaf, not on the path): only [9] is left."""
    t = TokenRadix(capacity_tokens=10)
    t.insert([1, 2, 3])
    t.insert([1, 2, 4])
    t.capacity_tokens = 1
    t.insert([9])
    t.check()
    assert (t.total_tokens, t.match([1, 2, 3]), t.match([9])) == (1, 0, 1)


def test_eviction_stops_as_soon_as_it_fits() -> None:
    """Leaves by recency: a (oldest), b, c; capacity 7 with 9 stored + 1 new: a goes, b stays."""
    t = TokenRadix(capacity_tokens=7)
    t.insert([1, 1, 1])
    t.insert([2, 2, 2])
    t.insert([3])
    t.insert([4, 4, 4])
    t.check()
    assert (t.match([1, 1, 1]), t.match([2, 2, 2]), t.match([3]), t.total_tokens) == (0, 3, 1, 7)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenRadix(0)
    with pytest.raises(ValueError):
        TokenCaches(max_keys=0)
    with pytest.raises(ValueError):
        TokenCaches(total_tokens=0)
    with pytest.raises(ValueError):
        engine_cached_tokens(TokenRadix(), [1, 2], page_size=0)


def test_engine_cached_tokens_all_but_the_last_rounded_to_pages() -> None:
    t = TokenRadix()
    t.insert(list(range(40)))
    assert engine_cached_tokens(t, list(range(40))) == 39  # all but the last
    assert engine_cached_tokens(t, list(range(40)), page_size=16) == 32
    assert engine_cached_tokens(t, list(range(41)), page_size=16) == 32  # 40 matched -> 32
    assert engine_cached_tokens(t, list(range(33)), page_size=16) == 32
    assert engine_cached_tokens(t, [0]) == 0 and engine_cached_tokens(t, []) == 0
    assert engine_cached_tokens(t, [0, 99]) == 1


def test_session_caches_outcome_and_key_bounds() -> None:
    c = TokenCaches(capacity_tokens=100, max_keys=2, total_tokens=1000, page_size=1)
    first = c.process("a", [1, 2, 3, 4])
    assert (first.input_tokens, first.cached_read_tokens, first.cache_write_tokens, first.uncached_tokens) == (4, 0, 0, 4)
    again = c.process("a", [1, 2, 3, 4, 5, 6])
    assert (again.input_tokens, again.cached_read_tokens, again.uncached_tokens) == (6, 4, 2)
    c.process("b", [7])
    c.process("a", [1])  # a used again: b is now the least recent key
    c.process("c", [8])
    assert set(c._trees) == {"a", "c"} and len(c) == 2
    assert c.stored_tokens() == 6 + 1


def test_the_total_bound_drops_old_keys_but_never_the_one_in_use() -> None:
    c = TokenCaches(capacity_tokens=100, max_keys=10, total_tokens=10)
    c.process("a", list(range(6)))
    c.process("b", list(range(100, 104)))
    assert len(c) == 2 and c.stored_tokens() == 10  # exactly at the bound: both kept
    c.process("c", list(range(200, 212)))  # 12 alone, over the bound: the others go, c stays
    assert list(c._trees) == ["c"] and c.stored_tokens() == 12
