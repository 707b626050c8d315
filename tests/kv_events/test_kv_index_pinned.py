"""One deployment's block index and its batch numbers, pinned point by point (issue 21;
:mod:`prefixgate.proxy.routing.kv_index`): every event kind with its counter, the bound (oldest
stored forgotten first, a re-stored block made the newest), the prefix walk, and each verdict of
:class:`SeqTracker` at its edges. Pure, no sockets (the stream's own tests: test_stream.py)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.proxy.routing.kv_index import BlockIndex, SeqTracker


def _counters(ix: BlockIndex) -> tuple[int, int, int, int]:
    return ix.stored, ix.removed, ix.cleared, ix.bad


def test_a_new_index_is_empty_with_every_counter_at_zero() -> None:
    ix = BlockIndex()
    assert len(ix) == 0 and ix.max_blocks == 1_000_000
    assert _counters(ix) == (0, 0, 0, 0)


def test_stored_blocks_are_held_in_order_each_counted() -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [1, 2, 3], None, [10, 11], 4])
    assert list(ix.blocks) == [1, 2, 3] and len(ix) == 3
    assert _counters(ix) == (3, 0, 0, 0)
    ix.apply(("BlockStored", [b"\x00" * 8 + (4).to_bytes(8, "big")]))  # a tuple, a bytes hash
    assert list(ix.blocks) == [1, 2, 3, 4] and ix.stored == 4


def test_unreadable_hashes_in_a_stored_event_are_skipped_not_counted() -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [5, "x", None, True, b"", 6]])
    assert list(ix.blocks) == [5, 6]
    assert _counters(ix) == (2, 0, 0, 0)


def test_a_restored_block_becomes_the_newest_and_the_bound_forgets_the_oldest() -> None:
    ix = BlockIndex(max_blocks=3)
    ix.apply(["BlockStored", [1, 2, 3]])
    assert list(ix.blocks) == [1, 2, 3]  # at the bound: all kept
    ix.apply(["BlockStored", [1]])  # stored again: now the newest
    assert list(ix.blocks) == [2, 3, 1]
    ix.apply(["BlockStored", [4, 5]])
    assert list(ix.blocks) == [1, 4, 5]
    assert ix.stored == 6


def test_removed_counts_only_blocks_that_were_held() -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [1, 2, 3]])
    ix.apply(["BlockRemoved", [2, 9, 2]])
    assert list(ix.blocks) == [1, 3]
    assert _counters(ix) == (3, 1, 0, 0)
    ix.apply(["BlockRemoved", [1, 3], "extra"])
    assert len(ix) == 0 and ix.removed == 3


def test_all_blocks_cleared_forgets_everything_and_counts_once() -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [1, 2]])
    ix.apply(["AllBlocksCleared"])
    assert len(ix) == 0 and _counters(ix) == (2, 0, 1, 0)
    ix.clear()
    assert ix.cleared == 2


@pytest.mark.parametrize("event", [
    None, "BlockStored", [], (), [7, [1]], ["Unknown", [1]], ["BlockStored"], ["BlockStored", 5],
    ["BlockStored", (1, 2)], ["BlockRemoved"], ["BlockRemoved", 1], {"BlockStored": [1]},
])
def test_an_event_not_understood_is_counted_bad_and_changes_nothing(event: Any) -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [1, 2]])
    ix.apply(event)
    assert list(ix.blocks) == [1, 2]
    assert _counters(ix) == (2, 0, 0, 1)


def test_every_event_not_understood_counts_one_more() -> None:
    ix = BlockIndex()
    for n, event in enumerate([None, "x", ["Nope"], ["BlockStored", 1], [3], ["BlockRemoved"]], 1):
        ix.apply(event)
        assert ix.bad == n


def test_apply_all_applies_a_batch_in_order() -> None:
    ix = BlockIndex()
    ix.apply_all([["BlockStored", [1, 2]], ["BlockRemoved", [1]], ["BlockStored", [1]], "junk"])
    assert list(ix.blocks) == [2, 1]
    assert _counters(ix) == (3, 1, 0, 1)


def test_the_prefix_walk_counts_leading_held_blocks_to_the_first_miss() -> None:
    ix = BlockIndex()
    ix.apply(["BlockStored", [11, 22, 33, 55]])
    assert ix.prefix_blocks([11, 22, 33, 44, 55]) == 3
    assert ix.prefix_blocks([11, 22, 33, 55]) == 4
    assert ix.prefix_blocks([99, 11]) == 0
    assert ix.prefix_blocks([]) == 0


@pytest.mark.parametrize(("last", "seq", "want"), [
    (0, 0, "apply"), (0, 1, "apply"), (0, 57, "apply"),  # nothing applied yet: anything
    (5, 6, "apply"),
    (5, 5, "old"), (5, 3, "old"), (5, 2, "old"),
    (5, 7, "gap"), (5, 100, "gap"),
    (5, 1, "restart"), (5, 0, "restart"), (2, 1, "restart"),
    (1, 1, "old"), (1, 0, "old"), (1, 2, "apply"), (1, 3, "gap"),
    (2, 2, "old"), (2, 4, "gap"),
])
def test_each_batch_number_verdict_at_its_edges(last: int, seq: int, want: str) -> None:
    t = SeqTracker()
    assert t.last == 0
    t.last = last
    assert t.verdict(seq) == want
    assert t.last == last  # a verdict applies nothing
