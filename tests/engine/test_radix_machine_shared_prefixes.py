"""A stronger radix state machine: a two-letter alphabet so almost every insert shares a prefix
(splits everywhere), locks taken on interior prefixes of earlier inserts (the "locked interior
node with unlocked children" shape on every run, not 1 seed in 20), long runs, and the tree's
``check()`` plus the reference model's counters after every step (the inherited invariant).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.engine.test_radix_cache import RadixMachine

SMALL = st.lists(st.integers(0, 1), min_size=1, max_size=16)


class SharedPrefixMachine(RadixMachine):
    """:class:`RadixMachine` plus shared-prefix inserts, interior locks and pressure evictions."""

    inserted: list[tuple[bytes | None, list[int]]]

    @rule(tokens=SMALL, key=st.sampled_from([None, b"k"]))
    def insert_shared(self, tokens: list[int], key: bytes | None) -> None:
        self.insert(tokens, key)
        if not hasattr(self, "inserted"):
            self.inserted = []
        self.inserted.append((key, tokens))

    @rule(data=st.data())
    def lock_interior_prefix(self, data: st.DataObject) -> None:
        if not getattr(self, "inserted", None):
            return
        key, tokens = data.draw(st.sampled_from(self.inserted))
        cut = data.draw(st.integers(1, len(tokens)))
        self.match(tokens[:cut], key, True)

    @rule(data=st.data())
    def extend_a_locked_path(self, data: st.DataObject) -> None:
        """Insert below a locked handle's path: an unlocked child under a locked node."""
        if not getattr(self, "inserted", None):
            return
        key, tokens = data.draw(st.sampled_from(self.inserted))
        self.insert(tokens + data.draw(SMALL), key)

    @rule(n=st.integers(1, 64))
    def evict_under_pressure(self, n: int) -> None:
        self.evict(n)


SharedPrefixMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_radix_shared_prefix_machine = SharedPrefixMachine.TestCase
