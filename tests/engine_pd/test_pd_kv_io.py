"""pd/kv_io: export locks what the decode side lacks, import writes exactly that KV, locks drop."""

from __future__ import annotations

import pytest
import torch

from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.kv.radix_cache import RadixCache
from prefixgate.local_engine.pd.kv_io import (
    ImportedPrefix,
    ImportReservation,
    cancel_import,
    export_prefix,
    finish_import,
    gather_kv,
    import_kv,
    kv_view,
    release,
    reserve_import,
    write_import,
)

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


def _kv_of(tokens: list[int]) -> torch.Tensor:
    """K/V ``[L, 2, n, H, D]`` holding (token id + 100 * layer, its negative)."""
    k = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1, 1).expand(L, -1, H, D).clone()
    k += torch.arange(L, dtype=torch.float32).view(L, 1, 1, 1) * 100
    return torch.stack([k, -k], dim=1)


def test_a_staged_import_written_in_pieces_equals_the_whole_import() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2], cache)
    tokens = [1, 2, 3, 4, 5, 6, 7]
    kv = _kv_of(tokens[2:])
    res = reserve_import(pool, cache, tokens, None, 2, 5)
    assert isinstance(res, ImportReservation) and res.num_new == 5
    assert cache.match_prefix(tokens).handle.cached_len == 2  # not in the tree before finish
    assert cache.protected_size == 2  # the kept prefix is locked meanwhile
    for lo, hi in ((3, 5), (0, 1), (1, 3)):  # any pieces, any order
        write_import(pool, res, kv, lo, hi)
    imp = finish_import(pool, cache, res)
    assert imp.handle is not None and imp.new_tokens == 5
    m = cache.match_prefix(tokens)
    assert m.handle.cached_len == 7
    assert pool.k[1][torch.tensor(m.slots)][:, 0, 0].tolist() == [101.0 + i for i in range(7)]
    assert pool.v[0][torch.tensor(m.slots[2:])][:, 1, 2].tolist() == [-3.0, -4.0, -5.0, -6.0,
                                                                      -7.0]
    assert cache.protected_size == 7
    release(cache, imp.handle)
    assert cache.protected_size == 0
    cache.check()


def test_a_cancelled_import_gives_its_pages_back_and_unlocks() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2], cache)
    free = pool.free_slots
    res = reserve_import(pool, cache, [1, 2, 3, 4], None, 2, 2)
    assert isinstance(res, ImportReservation) and pool.free_slots == free - 2
    write_import(pool, res, _kv_of([3, 4]), 0, 1)
    cancel_import(pool, cache, res)
    assert pool.free_slots == free and cache.protected_size == 0
    assert cache.match_prefix([1, 2, 3, 4]).handle.cached_len == 2
    cache.check()


def test_a_finish_after_the_tree_grew_frees_the_duplicate_pages() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2], cache)
    tokens = [1, 2, 3, 4, 5]
    res = reserve_import(pool, cache, tokens, None, 2, 3)
    assert isinstance(res, ImportReservation)
    write_import(pool, res, _kv_of(tokens[2:]), 0, 3)
    _fill(pool, [1, 2, 3, 4], cache)  # another request inserted [3, 4] meanwhile
    free = pool.free_slots
    imp = finish_import(pool, cache, res)
    assert imp.handle is not None and imp.new_tokens == 1
    assert pool.free_slots == free + 2  # our pages for 3 and 4 came back
    m = cache.match_prefix(tokens)
    assert m.handle.cached_len == 5 and pool.k[0][m.slots[4]][0, 0].item() == 5.0
    release(cache, imp.handle)
    assert cache.protected_size == 0
    cache.check()


def test_reserve_takes_nothing_when_the_tree_holds_it_all_and_checks_the_kv_length() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2, 3], cache)
    free = pool.free_slots
    got = reserve_import(pool, cache, [1, 2, 3], None, 1, 2)
    assert isinstance(got, ImportedPrefix) and got.new_tokens == 0 and got.handle is not None
    assert pool.free_slots == free and cache.protected_size == 3
    release(cache, got.handle)
    with pytest.raises(ValueError):
        reserve_import(pool, cache, [1, 2, 3, 4], None, 1, 2)
    res = reserve_import(pool, cache, [1, 2, 3, 4], None, 1, 3)
    assert isinstance(res, ImportReservation)
    with pytest.raises(ValueError):
        write_import(pool, res, _kv_of([2, 3, 4]), 0, 2)
    cancel_import(pool, cache, res)


def test_pieces_skip_the_rows_of_tokens_the_tree_gained_since_the_send() -> None:
    pool, cache = _pool(), RadixCache()
    _fill(pool, [1, 2, 3, 4], cache)  # the transfer starts at 2; the tree now holds 4
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    res = reserve_import(pool, cache, tokens, None, 2, 6)
    assert isinstance(res, ImportReservation) and res.num_new == 4 and res.offset == 2
    kv = _kv_of(tokens[2:])
    write_import(pool, res, kv, 2, 4)
    write_import(pool, res, kv, 0, 2)
    imp = finish_import(pool, cache, res)
    m = cache.match_prefix(tokens)
    assert m.handle.cached_len == 8 and imp.new_tokens == 4
    assert pool.k[1][torch.tensor(m.slots[4:])][:, 0, 0].tolist() == [105.0, 106.0, 107.0, 108.0]
    assert pool.v[0][torch.tensor(m.slots[4:])][:, 1, 1].tolist() == [-5.0, -6.0, -7.0, -8.0]
    release(cache, imp.handle)
    cache.check()
