"""Packed ragged attention over pool slots vs a naive per-sequence reference; pool allocator."""

from __future__ import annotations

import pytest
import torch

from prefixgate.local_engine.kv.pool import KVPool, PoolExhausted, ReqToTokenTable
from prefixgate.local_engine.model.attention import AttnMeta, attend, decode_group, prefill_group


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached: int) -> torch.Tensor:
    """q [n, H, D], k/v [L, KVH, D] (L = cached + n), causal from ``cached``. → [n, H*D]."""
    n, h, d = q.shape
    g = h // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) / d**0.5
    allowed = torch.arange(k.shape[0])[None, :] <= (cached + torch.arange(n))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v).reshape(n, h * d)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 6), (9, 3)])
def test_packed_prefill_and_decode_groups_match_reference(heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    d, slots = 16, 200
    kc, vc = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    perm = torch.randperm(slots)  # sequences own scattered slots
    # two prefill chunks (cached 0 and 7) then three decode rows of ragged lengths
    specs = [(0, 5), (7, 4)]
    decode_lens = [3, 11, 6]
    seq_slots, start = [], 0
    for cached, n in specs + [(ln - 1, 1) for ln in decode_lens]:
        seq_slots.append(perm[start:start + cached + n])
        start += cached + n
    t = sum(n for _, n in specs) + len(decode_lens)
    q = torch.randn(t, heads, d)
    groups, row = [], 0
    for (cached, n), sl in zip(specs, seq_slots):
        groups.append(prefill_group(row, cached, n, sl, heads // kv_heads, torch.device("cpu")))
        row += n
    table = torch.zeros(len(decode_lens), max(decode_lens), dtype=torch.int64)
    for i, sl in enumerate(seq_slots[len(specs):]):
        table[i, : len(sl)] = sl
    groups.append(decode_group(row, decode_lens, table, torch.device("cpu")))
    meta = AttnMeta(cos=torch.empty(0), sin=torch.empty(0), out_slots=torch.empty(0),
                    groups=groups, gqa=heads // kv_heads)
    out = attend(q, kc, vc, meta)
    ref, row = [], 0
    for (cached, n), sl in zip(specs + [(ln - 1, 1) for ln in decode_lens], seq_slots):
        ref.append(naive(q[row:row + n], kc[sl], vc[sl], cached))
        row += n
    torch.testing.assert_close(out, torch.cat(ref), rtol=1e-5, atol=1e-5)


def test_pool_pages_alloc_free_and_exhaustion() -> None:
    pool = KVPool(1, 10, 1, 4, torch.float32, torch.device("cpu"), page_size=4)
    assert pool.num_slots == 8 and pool.free_slots == 8  # rounded down to whole pages
    pages = pool.alloc_pages(2)
    assert pool.page_slots(pages) == [0, 1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(PoolExhausted):
        pool.alloc_pages(1)
    pool.free(pool.page_slots(pages)[:6])  # a partly used last page frees the whole page
    assert pool.free_slots == 8


def test_pool_budget_and_write() -> None:
    per_slot = 2 * 3 * 2 * 8 * 2  # K+V, 3 layers, 2 heads, 8 dims, fp16
    assert KVPool.slots_for_budget(1 / 1024, 3, 2, 8, torch.float16) == (1 << 20) // per_slot
    pool = KVPool(3, 16, 2, 8, torch.float16, torch.device("cpu"))
    k, v = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    pool.write(1, torch.tensor([5, 9]), k, v)
    assert pool.k[1].dtype == torch.float16
    torch.testing.assert_close(pool.k[1][9].float(), k[1], rtol=1e-3, atol=1e-3)
    assert pool.k[0].abs().sum() == 0


def test_req_to_token_rows() -> None:
    table = ReqToTokenTable(2, 8, torch.device("cpu"))
    r0, r1 = table.acquire(), table.acquire()
    with pytest.raises(RuntimeError):
        table.acquire()
    table.set(r1, 2, [7, 8])
    assert table.table[r1].tolist() == [0, 0, 7, 8, 0, 0, 0, 0]
    table.release(r0)
    assert table.free_rows == 1
