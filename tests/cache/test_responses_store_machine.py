"""The response store's bounds, pinned (issue 21): :class:`MemoryResponseStore` of
:mod:`prefixgate.cache.state.responses_store`.

Its docstring is the source: an LRU bounded in entries, in JSON bytes (the least recently used
go first) and in age (``ttl_s`` since stored: an older entry reads as absent); a response larger
than ``max_bytes`` is not stored; ``put`` replaces an entry with the same id (counted once
against the bound). A hypothesis state machine runs put / get / delete / clock steps against a
plain ordered dict; hand-computed cases pin the size of an entry and each edge.
"""

from __future__ import annotations

import types
from collections import OrderedDict

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from prefixgate.cache.state import responses_store as rs
from prefixgate.cache.state.responses_store import MemoryResponseStore, StoredResponse


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(rs, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def _size(r: StoredResponse) -> int:
    """The store's own rule (its module docstring): the compact JSON of ``[response,
    input_items]`` + the id, backend and tenant strings + ENTRY_OVERHEAD per entry."""
    blob = orjson.dumps([r.response, r.input_items])
    return len(blob) + len(r.id) + len(r.backend) + len(r.tenant) + rs.ENTRY_OVERHEAD


def rec(i: str, n: int = 0, backend: str = "b") -> StoredResponse:
    return StoredResponse(id=i, backend=backend, response={"output": [{"t": "x" * n}]} if n >= 0 else None,
                          input_items=[{"role": "user"}])


def test_the_size_of_an_entry_by_hand() -> None:
    """JSON of [response, input_items] + id + backend + tenant + the per-entry overhead:
    b'[{"a":1},[]]' is 12 bytes, "r1" 2, "bk" 2, "" 0 -> 16 + ENTRY_OVERHEAD."""
    r = StoredResponse(id="r1", backend="bk", response={"a": 1})
    assert _size(r) == 16 + rs.ENTRY_OVERHEAD
    s = MemoryResponseStore()
    s.put(r)
    assert s.bytes == 16 + rs.ENTRY_OVERHEAD and len(s) == 1
    p = StoredResponse(id="p", backend="openai", tenant="acme")  # a pointer: b'[null,[]]' = 9
    s.put(p)
    assert s.bytes == 16 + rs.ENTRY_OVERHEAD + 9 + 1 + 6 + 4 + rs.ENTRY_OVERHEAD


def test_history_is_input_then_output() -> None:
    r = StoredResponse(id="r", backend="b", response={"output": [{"o": 1}, {"o": 2}]},
                       input_items=[{"i": 1}])
    assert r.history() == [{"i": 1}, {"o": 1}, {"o": 2}]
    assert StoredResponse(id="p", backend="b", input_items=[{"i": 1}]).history() == [{"i": 1}]
    assert r.input_items == [{"i": 1}]  # not changed by history()


def test_a_replaced_entry_counts_once(clock: list[float]) -> None:
    s = MemoryResponseStore(max_bytes=10_000)
    s.put(rec("a", 100))
    one = s.bytes
    s.put(rec("a", 100))
    assert s.bytes == one and len(s) == 1
    s.put(rec("a", 10))
    assert s.bytes == _size(rec("a", 10))


def test_the_byte_bound_evicts_the_least_recently_used(clock: list[float]) -> None:
    size = _size(rec("a", 50))
    s = MemoryResponseStore(max_bytes=3 * size)
    for i in "abc":
        s.put(rec(i, 50))
    assert s.bytes == 3 * size  # exactly at the bound: all kept
    assert s.get("a") is not None  # "a" is now the most recent
    s.put(rec("d", 50))
    assert s.get("b") is None and s.get("a") is not None and s.get("c") is not None
    assert s.bytes == 3 * size and len(s) == 3


def test_too_large_is_not_stored_and_drops_the_old_one(clock: list[float]) -> None:
    s = MemoryResponseStore(max_bytes=200)
    s.put(rec("a", 10))
    s.put(rec("a", 500))
    assert s.get("a") is None and s.bytes == 0 and len(s) == 0
    exact = rec("e", 0)
    s2 = MemoryResponseStore(max_bytes=_size(exact))
    s2.put(exact)
    assert s2.get("e") == exact  # exactly max_bytes fits (a read is a fresh copy)


def test_the_entry_bound(clock: list[float]) -> None:
    s = MemoryResponseStore(max_entries=2)
    for i in "abc":
        s.put(rec(i))
    assert [s.get(i) is not None for i in "abc"] == [False, True, True]
    assert s.bytes == 2 * _size(rec("a"))


def test_ttl_since_stored_that_instant_included(clock: list[float]) -> None:
    s = MemoryResponseStore(ttl_s=60.0)
    s.put(rec("a"))
    clock[0] += 30
    assert s.get("a") is not None  # a read does not renew the age
    clock[0] += 30
    assert s.get("a") is not None  # exactly ttl_s old: still there
    clock[0] += 0.5
    assert s.get("a") is None and s.bytes == 0 and len(s) == 0


def test_delete(clock: list[float]) -> None:
    s = MemoryResponseStore()
    s.put(rec("a", 5))
    assert s.delete("a") is True and s.bytes == 0
    assert s.delete("a") is False and s.delete("never") is False


class Store(RuleBasedStateMachine):
    """put / get / delete / tick against an ordered dict (least recently used first)."""

    MAX_BYTES, MAX_ENTRIES, TTL = 700, 4, 10.0

    def __init__(self) -> None:
        super().__init__()
        self.now = [0.0]
        self.saved = rs.time
        rs.time = types.SimpleNamespace(monotonic=lambda: self.now[0])  # type: ignore[assignment]
        self.s = MemoryResponseStore(self.MAX_ENTRIES, self.MAX_BYTES, self.TTL)
        self.m: OrderedDict[str, tuple[float, int, StoredResponse]] = OrderedDict()

    def teardown(self) -> None:
        rs.time = self.saved  # type: ignore[assignment]

    @rule(i=st.sampled_from("abcdef"), n=st.integers(-1, 400), backend=st.sampled_from(["b", "openai"]))
    def put(self, i: str, n: int, backend: str) -> None:
        r = rec(i, n, backend)
        size = _size(r)
        self.m.pop(i, None)
        if size <= self.MAX_BYTES:
            self.m[i] = (self.now[0], size, r)
            while len(self.m) > self.MAX_ENTRIES or sum(v[1] for v in self.m.values()) > self.MAX_BYTES:
                self.m.popitem(last=False)
        self.s.put(r)

    @rule(i=st.sampled_from("abcdefg"))
    def get(self, i: str) -> None:
        hit = self.m.get(i)
        want = None
        if hit is not None:
            if self.now[0] - hit[0] > self.TTL:
                del self.m[i]
            else:
                self.m.move_to_end(i)
                want = hit[2]
        assert self.s.get(i) == want  # a fresh copy of what was stored

    @rule(i=st.sampled_from("abcdefg"))
    def delete(self, i: str) -> None:
        assert self.s.delete(i) == (self.m.pop(i, None) is not None)

    @rule(dt=st.sampled_from([0.0, 1.0, 5.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.now[0] += dt

    @invariant()
    def bounded_and_exact(self) -> None:
        assert self.s.bytes == sum(v[1] for v in self.m.values()) <= self.MAX_BYTES
        assert len(self.s) == len(self.m) <= self.MAX_ENTRIES
        assert list(self.s._items) == list(self.m)


Store.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_the_store_keeps_its_bounds = Store.TestCase


def test_the_default_bounds() -> None:
    """10,000 responses, 256 MiB held, 24 h (the module's documented defaults)."""
    s = MemoryResponseStore()
    assert (s.max_entries, s.max_bytes, s.ttl_s) == (10_000, 256 * 1024 * 1024, 86_400.0)
