"""Deterministic lock / evict shapes of the radix cache (the hypothesis machine reaches some of
them in only a few seeds). A bug in any of these frees the KV slots of a running request."""

from __future__ import annotations

from prefixgate.local_engine.kv.radix_cache import RadixCache


def _cache_with(*seqs: list[int]) -> RadixCache:
    """A cache holding each sequence; slot ids are ``1000 * seq_index + position``."""
    c = RadixCache()
    for i, s in enumerate(seqs):
        c.insert(s, [1000 * i + p for p in range(len(s))])
    c.check()
    return c


def test_locked_leaf_keeps_its_slots_under_any_eviction_pressure() -> None:
    c = _cache_with([1, 2, 3, 4])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.handle)
    assert c.evict(10_000) == []
    assert c.protected_size == 4 and c.evictable_size == 0
    c.check()
    c.unlock(m.handle)
    assert sorted(c.evict(10_000)) == [0, 1, 2, 3]
    c.check()


def test_locked_interior_node_survives_when_its_unlocked_child_is_evicted() -> None:
    # [1,2] is shared; [1,2,3,4] and [1,2,5,6] branch from it. Lock only [1,2].
    c = _cache_with([1, 2, 3, 4], [1, 2, 5, 6])
    m = c.match_prefix([1, 2])
    assert m.handle.cached_len == 2
    c.lock(m.handle)
    freed = c.evict(10_000)
    # both unlocked branches go; the locked interior node (now a leaf) stays with its slots
    assert sorted(freed) == [2, 3, 1002, 1003]
    assert c.match_prefix([1, 2, 9]).slots == [0, 1]
    assert c.protected_size == 2 and c.evictable_size == 0
    c.check()
    c.unlock(m.handle)
    assert sorted(c.evict(10_000)) == [0, 1]
    assert c.total_size == 0
    c.check()


def test_evicting_a_child_does_not_cascade_into_its_locked_parent() -> None:
    # a chain: parent [1,2] locked by one request, child [3,4] unlocked; evict exactly the child
    c = _cache_with([1, 2], [1, 2, 3, 4])
    m = c.match_prefix([1, 2])
    c.lock(m.handle)
    assert sorted(c.evict(1)) == [1002, 1003]
    assert c.evict(1) == []  # the parent is locked: nothing more is evictable
    assert c.match_prefix([1, 2]).slots == [0, 1]
    c.check()


def test_split_of_a_locked_edge_keeps_both_halves_locked() -> None:
    c = _cache_with([1, 2, 3, 4])
    m = c.match_prefix([1, 2, 3, 4])
    c.lock(m.handle)
    # a new sequence diverging at position 2 splits the locked edge [1,2,3,4] into [1,2]+[3,4]
    c.insert([1, 2, 7, 8], [0, 1, 50, 51])
    c.check()
    assert c.protected_size == 4 and c.evictable_size == 2
    assert sorted(c.evict(10_000)) == [50, 51]  # only the new, unlocked branch
    c.unlock(m.handle)  # the handle's node is the lower half: unlock walks both halves
    c.check()
    assert c.protected_size == 0 and c.evictable_size == 4
    assert sorted(c.evict(10_000)) == [0, 1, 2, 3]


def test_two_requests_sharing_a_prefix_unlock_in_either_order() -> None:
    c = _cache_with([1, 2, 3], [1, 2, 4])
    a, b = c.match_prefix([1, 2, 3]), c.match_prefix([1, 2, 4])
    c.lock(a.handle)
    c.lock(b.handle)
    c.unlock(a.handle)
    c.check()
    # [1,2] is still locked through b; a's private tail [3] is evictable, b's is not
    assert c.evict(10_000) == [2]
    assert c.protected_size == 3
    c.unlock(b.handle)
    c.check()
    assert sorted(c.evict(10_000)) == [0, 1, 1002]
