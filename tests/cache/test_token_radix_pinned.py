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
    salt_id,
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
    with pytest.raises(ValueError, match="^capacity_tokens must be positive$"):
        TokenRadix(0)
    assert TokenRadix(1).capacity_tokens == 1
    with pytest.raises(ValueError, match="^max_keys and total_tokens must be positive$"):
        TokenCaches(max_keys=0)
    with pytest.raises(ValueError, match="^max_keys and total_tokens must be positive$"):
        TokenCaches(total_tokens=0)
    one = TokenCaches(max_keys=1, total_tokens=1)  # the smallest bounds are allowed
    assert (one.max_keys, one.total_cap) == (1, 1)
    with pytest.raises(ValueError, match="^page_size must be positive$"):
        engine_cached_tokens(TokenRadix(), [1, 2], page_size=0)


def test_a_parent_with_children_left_is_never_evicted_with_them() -> None:
    """A=[1,2] over B=[3] and D=[5] over E=[6], F=[7]; inserting [9] at capacity 2 evicts B,
    E, F, then D and A as each is left childless: the count stays exact (a parent evicted while
    it still held D would drop D's id uncounted)."""
    t = TokenRadix(capacity_tokens=100)
    t.insert([1, 2, 3])
    t.insert([1, 2, 5, 6])
    t.insert([1, 2, 5, 7])
    t.capacity_tokens = 2
    assert t.total_tokens == 6
    t.insert([9])
    t.check()
    assert t.total_tokens == 1 and t.match([1, 2, 5, 7]) == 0 and t.match([9]) == 1


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


def test_salt_id_is_a_negative_31_bit_pseudo_id_of_the_salts_sha256() -> None:
    """-1 - (first 8 hex digits of sha256(salt) & 0x3FFFFFFF): values pinned, never a real id."""
    assert salt_id("a") == -177701139 and salt_id("tenant-1") == -177646516
    assert salt_id("") == -598787139
    assert salt_id("\ud800") == -296124858  # a lone surrogate is hashed, never an error
    for s in ("a", "b", "tenant-1", "x" * 500):
        assert -(2**30) <= salt_id(s) <= -1


def test_a_salted_prompt_matches_only_its_own_salt() -> None:
    """The pseudo id leads the path: the same ids under another salt, or none, share nothing;
    the pseudo id is stored (it takes one id of capacity) but never counted as cached."""
    c = TokenCaches(capacity_tokens=100)
    first = c.process("k", [1, 2, 3, 4], salt="s")
    assert (first.input_tokens, first.cached_read_tokens, first.uncached_tokens) == (4, 0, 4)
    assert c.stored_tokens() == 5  # 4 ids + the salt's pseudo id
    again = c.process("k", [1, 2, 3, 4], salt="s")
    assert (again.cached_read_tokens, again.uncached_tokens) == (3, 1)  # all but the last id
    assert c.process("k", [1, 2, 3, 4], salt="t").cached_read_tokens == 0
    assert c.process("k", [1, 2, 3, 4]).cached_read_tokens == 0  # unsalted: another path
    assert c.process("k", [1, 2, 3, 4]).cached_read_tokens == 3
    assert len(c) == 1 and c.stored_tokens() == 5 + 5 + 4


def test_a_salted_two_id_prompt_caches_one_and_a_one_id_prompt_none() -> None:
    c = TokenCaches(capacity_tokens=100)
    c.process("k", [7, 8], salt="s")
    assert c.process("k", [7, 8], salt="s").cached_read_tokens == 1
    c.process("k", [9], salt="s")
    assert c.process("k", [9], salt="s").cached_read_tokens == 0


def test_salted_cached_tokens_round_down_to_pages() -> None:
    c = TokenCaches(capacity_tokens=100, page_size=2)
    ids = [1, 2, 3, 4, 5]
    c.process("k", ids, salt="s")
    assert c.process("k", ids, salt="s").cached_read_tokens == 4  # 4 of 4 matched: 4
    assert c.process("k", [1, 2, 3, 4], salt="s").cached_read_tokens == 2  # 3 matched: 2


def _tree() -> tuple[TokenRadix, object]:
    t = TokenRadix(capacity_tokens=100)
    t.insert([1, 2, 3])
    t.insert([1, 2, 4])
    return t, t._root.children[1]


def test_check_catches_a_child_keyed_by_another_id() -> None:
    t, upper = _tree()
    t.check()
    kids = upper.children  # type: ignore[attr-defined]
    kids[9] = kids.pop(3)
    with pytest.raises(AssertionError):
        t.check()


def test_check_catches_a_child_not_pointing_back() -> None:
    t, upper = _tree()
    upper.children[3].parent = t._root  # type: ignore[attr-defined]
    with pytest.raises(AssertionError):
        t.check()


def test_check_catches_an_empty_key_and_a_wrong_total() -> None:
    t, upper = _tree()
    from array import array
    upper.children[3].key = array("i")  # type: ignore[attr-defined]
    with pytest.raises(AssertionError):
        t.check()
    t2, _ = _tree()
    t2.total_tokens += 1
    with pytest.raises(AssertionError):
        t2.check()


def test_unsalted_cached_tokens_round_down_to_the_caches_pages() -> None:
    c = TokenCaches(capacity_tokens=100, page_size=2)
    c.process("k", [1, 2, 3, 4, 5])
    assert c.process("k", [1, 2, 3, 4, 5]).cached_read_tokens == 4
    assert c.process("k", [1, 2, 3, 4]).cached_read_tokens == 2  # 3 matched: one page of 2
