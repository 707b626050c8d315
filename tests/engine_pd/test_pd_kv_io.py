"""pd_kv_io: export locks what the decode side lacks, import writes exactly that KV, locks drop."""

from __future__ import annotations

import pytest
import torch

from prefixgate.local_engine.kv_pool import KVPool
from prefixgate.local_engine.pd_kv_io import (
    export_prefix,
    gather_kv,
    import_kv,
    kv_view,
    release,
)
from prefixgate.local_engine.radix_cache import RadixCache

L, H, D = 2, 2, 4


def _pool(slots: int = 32, ps: int = 1) -> KVPool:
    return KVPool(L, slots, H, D, torch.float32, torch.device("cpu"), ps)


def _fill(pool: KVPool, tokens: list[int], cache: RadixCache, key: bytes | None = None) -> list[int]:
    """Put ``tokens`` in the tree with K/V = a value derived from (layer, token id)."""
    slots = pool.page_slots(pool.alloc_pages(len(tokens) // pool.page_size))
    idx = torch.tensor(slots)
    for layer in range(L):
        k = torch.tensor(tokens, dtype=torch.float32).view(-1, 1, 1).expand(-1, H, D) + layer * 100
        pool.write(layer, idx, k, -k)
    cache.insert(tokens, slots, key)
    return slots


def test_export_locks_the_part_past_start_and_release_unlocks() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [5, 6, 7, 8, 9], cache)
    exp = export_prefix(cache, [5, 6, 7, 8, 9, 10], None, start=2)
    assert exp is not None
    assert exp.tokens == [5, 6, 7, 8, 9] and exp.start == 2 and exp.num_transfer == 3
    assert cache.protected_size == 5
    out = kv_view(torch.zeros(L * 2 * 3 * H * D), L, 3, H, D)
    gather_kv(pool, exp.slots, out)
    assert out[1, 0, :, 0, 0].tolist() == [107.0, 108.0, 109.0]
    assert out[0, 1, :, 0, 0].tolist() == [-7.0, -8.0, -9.0]
    release(cache, exp.handle)
    assert cache.protected_size == 0 and cache.evictable_size == 5
    cache.check()


def test_export_is_none_when_the_decode_side_holds_it_all() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2, 3], cache)
    assert export_prefix(cache, [1, 2, 3, 4], None, start=3) is None
    assert cache.protected_size == 0
    with pytest.raises(ValueError):
        export_prefix(cache, [1, 2], None, start=-1)


def test_export_start_drops_to_a_page_boundary() -> None:
    pool, cache = _pool(ps=2), RadixCache(2)
    _fill(pool, [1, 2, 3, 4, 5, 6], cache)
    exp = export_prefix(cache, [1, 2, 3, 4, 5, 6, 7], None, start=3)
    assert exp is not None and exp.start == 2 and exp.num_transfer == 4


def test_import_writes_the_received_kv_and_locks_it() -> None:
    src_pool, src = _pool(), RadixCache()
    _fill(src_pool, [1, 2, 3, 4, 5], src)
    dst_pool, dst = _pool(), RadixCache()
    _fill(dst_pool, [1, 2], dst)
    exp = export_prefix(src, [1, 2, 3, 4, 5, 6], None, start=2)
    assert exp is not None
    kv = kv_view(torch.zeros(1000), L, exp.num_transfer, H, D)
    gather_kv(src_pool, exp.slots, kv)
    free_before = dst_pool.free_slots
    imp = import_kv(dst_pool, dst, exp.tokens, None, exp.start, kv)
    assert imp.handle is not None and imp.new_tokens == 3
    assert dst_pool.free_slots == free_before - 3
    match = dst.match_prefix([1, 2, 3, 4, 5])
    assert match.handle.cached_len == 5
    got = dst_pool.k[1][torch.tensor(match.slots)][:, 0, 0].tolist()
    assert got == [101.0, 102.0, 103.0, 104.0, 105.0]
    assert dst_pool.v[0][torch.tensor(match.slots[2:])][:, 1, 3].tolist() == [-3.0, -4.0, -5.0]
    assert dst.protected_size == 5
    release(dst, imp.handle)
    assert dst.protected_size == 0
    dst.check()


def test_import_skips_what_the_tree_already_holds() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2, 3], cache)
    kv = torch.full((L, 2, 2, H, D), 7.0)
    imp = import_kv(pool, cache, [1, 2, 3, 4], None, 2, kv)
    assert imp.new_tokens == 1
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.handle.cached_len == 4
    assert pool.k[0][m.slots[2]][0, 0].item() == 3.0  # kept its own, not overwritten
    assert pool.k[0][m.slots[3]][0, 0].item() == 7.0


def test_import_with_a_gap_inserts_nothing() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1], cache)
    imp = import_kv(pool, cache, [1, 2, 3, 4], None, 2, torch.zeros(L, 2, 2, H, D))
    assert imp.handle is None and imp.reason == "gap"
    assert cache.protected_size == 0 and cache.match_prefix([1, 2, 3]).handle.cached_len == 1


def test_import_without_room_gives_everything_back() -> None:
    pool, cache = _pool(slots=4), RadixCache()
    _fill(pool, [1, 2], cache)
    held = pool.alloc_pages(2)  # a running request holds the rest
    imp = import_kv(pool, cache, [1, 2, 3, 4], None, 2, torch.zeros(L, 2, 2, H, D))
    assert imp.handle is None and imp.reason == "no_room"
    assert cache.protected_size == 0 and pool.free_slots == 0
    pool.free(held)


def test_import_evicts_unlocked_leaves_for_room_but_never_its_prefix() -> None:
    pool, cache = _pool(slots=6), RadixCache()
    _fill(pool, [1, 2], cache)
    _fill(pool, [9, 9, 9, 9], cache)  # an old unrelated entry fills the pool
    imp = import_kv(pool, cache, [1, 2, 3, 4], None, 2, torch.ones(L, 2, 2, H, D))
    assert imp.handle is not None
    assert cache.match_prefix([1, 2, 3, 4]).handle.cached_len == 4
    assert cache.match_prefix([9, 9, 9]).handle.cached_len < 3


def test_import_checks_alignment_and_shape() -> None:
    pool, cache = _pool(ps=2), RadixCache(2)
    with pytest.raises(ValueError):
        import_kv(pool, cache, [1, 2, 3], None, 0, torch.zeros(L, 2, 3, H, D))
    with pytest.raises(ValueError):
        import_kv(pool, cache, [1, 2, 3, 4], None, 0, torch.zeros(L, 2, 3, H, D))
    with pytest.raises(ValueError):
        kv_view(torch.zeros(10), L, 3, H, D)


def test_salted_import_lands_in_its_namespace_only() -> None:
    pool, cache = _pool(), RadixCache()
    imp = import_kv(pool, cache, [1, 2], b"t1", 0, torch.zeros(L, 2, 2, H, D))
    assert imp.handle is not None
    assert cache.match_prefix([1, 2], b"t1").handle.cached_len == 2
    assert cache.match_prefix([1, 2], None).handle.cached_len == 0
