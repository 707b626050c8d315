"""The KV pool: preallocated per-layer K/V storage addressed by token slot, and its allocator.

Every cached token of every request (running or kept in the radix tree) lives in one *slot*:
row ``s`` of ``k[layer]`` / ``v[layer]``, each ``[num_slots, kv_heads, head_dim]``. Slots are
handed out in *pages* of ``page_size`` consecutive slots (default 1, as in SGLang's token pool);
page ``p`` owns slots ``p*page_size .. p*page_size + page_size - 1``.

``ReqToTokenTable`` is the per-request slot map (SGLang's ``req_to_token``): row ``r`` lists the
slots of request ``r``'s tokens in order, so the slots of a whole batch are gathered in one
indexing op per step instead of one Python list per request.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class PoolExhausted(RuntimeError):
    """Raised by ``KVPool.alloc_pages`` when fewer pages are free than asked for."""


class KVPool:
    """Per-layer K/V tensors ``[num_slots, kv_heads, head_dim]`` plus a free list of pages.

    ``num_slots`` is rounded down to a multiple of ``page_size``. ``dtype`` is the storage dtype
    (may be narrower than the compute dtype, e.g. fp16 KV with fp32 compute); ``write`` casts.
    """

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        num_pages = num_slots // page_size
        if num_pages < 1:
            raise ValueError(f"KV pool of {num_slots} slots holds no page of {page_size}")
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.num_pages = num_pages
        self.dtype = dtype
        shape = (self.num_slots, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # a stack popped from the end: ascending page ids come out first (contiguous slots)
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @staticmethod
    def slots_for_budget(kv_memory_gb: float, num_layers: int, kv_heads: int, head_dim: int,
                         dtype: torch.dtype) -> int:
        """How many token slots fit in ``kv_memory_gb`` GiB of K+V storage over all layers."""
        per_slot = 2 * num_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
        return max(1, int(kv_memory_gb * (1 << 30)) // per_slot)

    @property
    def free_slots(self) -> int:
        """Slots not held by any request or the radix tree."""
        return len(self._free) * self.page_size

    @property
    def used_slots(self) -> int:
        """Token slots currently allocated (tokens)."""
        return self.num_slots - self.free_slots

    def alloc_pages(self, n: int) -> list[int]:
        """Take ``n`` free pages; returns their ids. Raises ``PoolExhausted`` if too few are free."""
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} pages, {len(self._free)} free")
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        return pages

    def page_slots(self, pages: list[int]) -> list[int]:
        """Slot ids of ``pages`` in order (``page_size`` per page)."""
        ps = self.page_size
        if ps == 1:
            return list(pages)
        return [p * ps + i for p in pages for i in range(ps)]

    def free(self, slots: list[int]) -> None:
        """Return slots to the pool. ``slots`` must cover whole pages (page-aligned runs)."""
        ps = self.page_size
        pages = slots if ps == 1 else [s // ps for s in slots[::ps]]
        self._free.extend(reversed(pages))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new keys/values ``[T, kv_heads, head_dim]`` of ``layer`` at ``slots [T]``."""
        if k.dtype != self.dtype:
            k, v = k.to(self.dtype), v.to(self.dtype)
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor,
                   k_map: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Copy the K/V of slots ``src [R]`` into slots ``dst [R]`` on every layer.

        ``k_map`` (optional) transforms the gathered keys ``[R, kv_heads, head_dim]`` before they
        are stored (span reuse re-rotates keys by a RoPE position shift); its result is cast to
        the storage dtype. ``src`` and ``dst`` must not overlap. Values are copied unchanged.
        """
        for layer in range(len(self.k)):
            k = self.k[layer].index_select(0, src)
            if k_map is not None:
                k = k_map(k).to(self.dtype)
            self.k[layer].index_copy_(0, dst, k)
            self.v[layer].index_copy_(0, dst, self.v[layer].index_select(0, src))


class ReqToTokenTable:
    """``[max_requests, max_context_len]`` int64 map: row r, column i = slot of token i of request r.

    Rows are leased to running requests (``acquire`` / ``release``). Unused cells hold slot 0, a
    valid index, so padded gathers never go out of range (their scores are masked out).
    """

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device) -> None:
        self.table = torch.zeros((max_requests, max_context_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))

    def acquire(self) -> int:
        """Lease a free row. Raises ``RuntimeError`` when all rows are leased."""
        if not self._free_rows:
            raise RuntimeError("no free request row (max_running reached)")
        return self._free_rows.pop()

    def release(self, row: int) -> None:
        """Return a request-table row to the free list."""
        self._free_rows.append(row)

    @property
    def free_rows(self) -> int:
        """Request-table rows still free."""
        return len(self._free_rows)

    def set(self, row: int, start: int, slots: list[int]) -> None:
        """Write ``slots`` into ``row`` at columns ``start .. start+len(slots)-1``."""
        if slots:
            self.table[row, start:start + len(slots)] = torch.tensor(slots, dtype=torch.int64)
