"""The recorder announces exactly the full blocks the radix tree holds (vLLM's event schema)."""

from __future__ import annotations

from prefixgate.local_engine.kv.block_hash import block_digests, wire_hash
from prefixgate.local_engine.kv.events import KVEventRecorder
from prefixgate.local_engine.kv.radix_cache import RadixCache, TreeNode


def _tree_blocks(tree: RadixCache, rec: KVEventRecorder) -> set[int]:
    """Every full block of every root-to-node path of the tree, hashed."""
    out: set[int] = set()
    for extra, root in tree._roots.items():
        stack: list[tuple[TreeNode, list[int]]] = [(root, [])]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                p = path + child.key
                out.update(wire_hash(d) for d in block_digests(p, rec.block_size, rec.algo,
                                                               rec.seed, extra))
                stack.append((child, p))
    return out


def _wired(block: int = 4) -> tuple[RadixCache, KVEventRecorder]:
    tree, rec = RadixCache(), KVEventRecorder(block)
    tree.on_evict, tree.on_reset = rec.evicted, rec.cleared
    return tree, rec


def _insert(tree: RadixCache, rec: KVEventRecorder, toks: list[int], salt: bytes | None = None,
            base: int = 0) -> None:
    tree.insert(toks, list(range(base, base + len(toks))), salt)
    rec.stored(salt, toks)


def test_first_event_says_the_cache_starts_empty() -> None:
    assert KVEventRecorder().take() == [["AllBlocksCleared"]]


def test_stored_announces_new_full_blocks_with_their_parent() -> None:
    tree, rec = _wired()
    rec.take()
    _insert(tree, rec, list(range(10)))  # blocks 0..3, 4..7; 8, 9 partial
    h = [wire_hash(d) for d in block_digests(list(range(12)), 4, "sha256", "")]
    assert rec.take() == [["BlockStored", h[:2], None, list(range(8)), 4, None, "GPU"]]
    _insert(tree, rec, list(range(12)), base=100)  # only the third block is new
    assert rec.take() == [["BlockStored", [h[2]], h[1], [8, 9, 10, 11], 4, None, "GPU"]]
    _insert(tree, rec, list(range(12)), base=200)  # nothing new: nothing announced
    assert rec.take() == []
    assert set(rec.held) == _tree_blocks(tree, rec)


def test_eviction_removes_every_block_reaching_into_the_leaf() -> None:
    tree, rec = _wired()
    _insert(tree, rec, list(range(12)))
    _insert(tree, rec, list(range(6)) + [60, 61, 62, 63, 64, 65], base=100)  # splits at 6
    rec.take()
    tree.evict(1)  # LRU leaf: the first branch's tail, tokens 6..11
    events = rec.take()
    assert [e[0] for e in events] == ["BlockRemoved"]
    gone = [wire_hash(d) for d in block_digests(list(range(12)), 4, "sha256", "")][1:]
    assert events[0][1] == gone  # block 4..7 straddles the split: it went with the leaf
    assert set(rec.held) == _tree_blocks(tree, rec)
    tree.evict(100)
    assert rec.held == {} and _tree_blocks(tree, rec) == set()


def test_salted_sequences_are_separate_blocks() -> None:
    tree, rec = _wired()
    _insert(tree, rec, list(range(8)))
    _insert(tree, rec, list(range(8)), salt=b"acme", base=50)
    assert len(rec.held) == 4 and set(rec.held) == _tree_blocks(tree, rec)
    tree.evict(100)
    assert rec.held == {}


def test_reset_clears_all_blocks_unless_locked() -> None:
    tree, rec = _wired()
    _insert(tree, rec, list(range(8)))
    m = tree.match_prefix(list(range(8)))
    tree.lock(m.handle)
    rec.take()
    assert tree.reset() is None and rec.take() == []  # a request holds part of it
    tree.unlock(m.handle)
    assert sorted(tree.reset() or []) == list(range(8))
    assert rec.take() == [["AllBlocksCleared"]] and rec.held == {}
    assert tree.total_size == 0
    tree.check()


def test_snapshot_rebuilds_the_held_set() -> None:
    tree, rec = _wired()
    _insert(tree, rec, list(range(12)))
    snap = rec.snapshot()
    assert snap[0] == ["AllBlocksCleared"]
    assert [e[1][0] for e in snap[1:]] == list(rec.held)
    assert snap[2][2] == snap[1][1][0]  # parents first, chained


def test_runs_split_where_a_held_block_sits_between_new_ones() -> None:
    from prefixgate.local_engine.kv.events import _runs

    assert _runs([]) == [] and _runs([0, 1, 2]) == [(0, 3)]
    assert _runs([0, 2, 3, 5]) == [(0, 1), (2, 4), (5, 6)]
    rec = KVEventRecorder(2)
    rec.take()
    toks = [1, 2, 3, 4, 5, 6]
    rec.stored(None, toks)
    h = list(rec.held)
    del rec.held[h[0]], rec.held[h[2]]  # blocks 0 and 2 gone, block 1 still held
    rec.take()
    rec.stored(None, toks)
    assert rec.take() == [["BlockStored", [h[0]], None, [1, 2], 2, None, "GPU"],
                          ["BlockStored", [h[2]], h[1], [5, 6], 2, None, "GPU"]]
