"""Radix tree: matching, splitting, lock_ref, LRU eviction, extra_key namespaces, invariants."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from prefixgate.local_engine.kv.radix_cache import CacheHandle, RadixCache, common_prefix_len


def test_match_returns_longest_prefix_and_its_slots() -> None:
    c = RadixCache()
    assert c.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
    assert c.insert([1, 2, 5], [20, 21, 22]) == 2  # shares [1, 2]: caller frees 20, 21
    m = c.match_prefix([1, 2, 5, 9])
    assert m.handle.cached_len == 3 and m.slots == [10, 11, 22]
    m = c.match_prefix([1, 2, 3])
    assert m.slots == [10, 11, 12]
    assert c.match_prefix([7]).slots == []
    assert c.total_size == 5
    c.check()


def test_locked_nodes_are_not_evicted_and_lru_goes_first() -> None:
    c = RadixCache()
    c.insert([1, 2, 3], [1, 2, 3])
    c.insert([4, 5], [4, 5])
    c.insert([6], [6])
    c.match_prefix([4, 5])  # touch: [6] is now least recently used, then [1,2,3]
    locked = c.match_prefix([1, 2, 3])
    c.lock(locked.handle)
    assert (c.evictable_size, c.protected_size) == (3, 3)
    assert c.evict(1) == [6]
    assert sorted(c.evict(100)) == [4, 5]   # [1,2,3] is locked
    assert c.total_size == 3 and c.protected_size == 3
    c.unlock(locked.handle)
    assert sorted(c.evict(100)) == [1, 2, 3]
    c.check()


def test_extra_key_namespaces_entries() -> None:
    """B23: same tokens, different media hash → no reuse; same hash → hit."""
    c = RadixCache()
    c.insert([1, 2, 3], [1, 2, 3], extra_key=b"red")
    assert c.match_prefix([1, 2, 3], extra_key=b"blue").handle.cached_len == 0
    assert c.match_prefix([1, 2, 3], extra_key=None).handle.cached_len == 0
    assert c.match_prefix([1, 2, 3], extra_key=b"red").slots == [1, 2, 3]


def test_page_size_matches_whole_pages_only() -> None:
    c = RadixCache(page_size=4)
    assert c.insert(list(range(10)), list(range(100, 110))) == 0  # only 8 tokens kept
    assert c.total_size == 8
    assert c.match_prefix(list(range(7)) + [99]).handle.cached_len == 4
    assert c.match_prefix(list(range(9))).slots == list(range(100, 108))
    assert c.insert([0, 1, 2, 3, 4, 5, 9, 9], [0] * 8) == 4  # diverges inside page 2
    c.check()


def test_common_prefix_len() -> None:
    a = list(range(200))
    assert common_prefix_len(a, a) == 200
    assert common_prefix_len(a, a[:130] + [-1]) == 130
    assert common_prefix_len([], a) == 0


class RadixMachine(RuleBasedStateMachine):
    """Random inserts / matches / locks / unlocks / evictions against a reference model.

    Reference: ``ref[(extra_key, prefix)] = slots of the prefix's last page`` for every page the
    tree holds (``prefix`` a page-aligned token tuple); a slot counter plays the KV pool.
    """

    @initialize(page=st.sampled_from([1, 2, 3]))
    def setup(self, page: int) -> None:
        self.cache = RadixCache(page_size=page)
        self.page = page
        self.ref: dict[tuple[bytes | None, tuple[int, ...]], tuple[int, ...]] = {}
        self.next_slot = itertools.count()
        self.handles: list[tuple[CacheHandle, list[int]]] = []

    def _expected_len(self, key: bytes | None, tokens: list[int]) -> int:
        n = 0
        while n + self.page <= len(tokens) and (key, tuple(tokens[: n + self.page])) in self.ref:
            n += self.page
        return n

    def _expected_slots(self, key: bytes | None, tokens: list[int], n: int) -> list[int]:
        return [s for end in range(self.page, n + 1, self.page)
                for s in self.ref[(key, tuple(tokens[:end]))]]

    tokens = st.lists(st.integers(0, 3), min_size=0, max_size=12)
    keys = st.sampled_from([None, b"img-a", b"img-b"])

    @rule(tokens=tokens, key=keys)
    def insert(self, tokens: list[int], key: bytes | None) -> None:
        slots = [next(self.next_slot) for _ in tokens]
        expected_prefix = self._expected_len(key, tokens)
        prefix = self.cache.insert(tokens, slots, key)
        assert prefix == expected_prefix
        usable = len(tokens) - len(tokens) % self.page
        for end in range(prefix + self.page, usable + 1, self.page):
            self.ref[(key, tuple(tokens[:end]))] = tuple(slots[end - self.page:end])

    @rule(tokens=tokens, key=keys, lock=st.booleans())
    def match(self, tokens: list[int], key: bytes | None, lock: bool) -> None:
        m = self.cache.match_prefix(tokens, key)
        n = self._expected_len(key, tokens)
        assert m.handle.cached_len == n
        assert m.slots == self._expected_slots(key, tokens, n)
        if lock and n:
            self.cache.lock(m.handle)
            self.handles.append((m.handle, m.slots))

    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        if self.handles:
            i = data.draw(st.integers(0, len(self.handles) - 1))
            handle, _ = self.handles.pop(i)
            self.cache.unlock(handle)

    @rule(n=st.integers(0, 20))
    def evict(self, n: int) -> None:
        protected = {s for _, slots in self.handles for s in slots}
        before = self.cache.evictable_size
        freed = self.cache.evict(n)
        assert not protected & set(freed), "a locked slot was evicted"
        assert len(freed) == len(set(freed))
        assert len(freed) >= min(n, before)  # frees enough when enough is evictable
        gone = set(freed)
        self.ref = {k: v for k, v in self.ref.items() if not gone & set(v)}

    @invariant()
    def counters_exact(self) -> None:
        self.cache.check()
        assert self.cache.evictable_size + self.cache.protected_size == len(self.ref) * self.page
        protected = {s for _, slots in self.handles for s in slots}
        assert self.cache.protected_size == len(protected)


RadixMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_radix_machine = RadixMachine.TestCase


@pytest.mark.parametrize("page", [1, 4])
def test_evict_removes_whole_leaf_chains(page: int) -> None:
    c = RadixCache(page_size=page)
    toks = list(range(4 * page))
    c.insert(toks, toks)
    c.insert(toks[: 2 * page] + [99] * (2 * page), list(range(100, 100 + 4 * page)))
    assert sorted(c.evict(10**6)) == sorted(toks + list(range(100 + 2 * page, 100 + 4 * page)))
    assert c.total_size == 0
    c.check()


def test_continuations_read_the_most_recent_branches_without_changing_the_tree() -> None:
    tree = RadixCache()
    tree.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    tree.insert([1, 2, 7, 8], [10, 11, 22, 23])
    tree.insert([1, 2, 9, 8, 6], [10, 11, 32, 33, 34])
    tree.insert([1, 2, 9, 5], [10, 11, 32, 44])  # the newest: under branch 9, leaf 5
    m = tree.match_prefix([1, 2, 0])
    before = (tree.evictable_size, tree.protected_size)
    got = tree.continuations(m.handle.node, max_len=3, max_branches=2)
    assert [(t, s) for t, s, _ in got] == [([9, 5], [32, 44]), ([7, 8], [22, 23])]
    assert got[0][2].key == [5]  # the deepest node read: lock it while copying
    assert tree.continuations(m.handle.node, max_len=1, max_branches=5)[2][0] == [3]
    assert (tree.evictable_size, tree.protected_size) == before
    tree.check()
