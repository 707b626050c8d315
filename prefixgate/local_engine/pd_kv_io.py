"""P/D disaggregation, engine-thread side: take a prompt's KV out of the pool, put one in.

Prefill instance (``export_prefix``): the radix tree's match of the whole prompt is locked and
the slots of the tokens the decode side lacks (``[start, matched)``) are handed to the sender,
which gathers them (``gather_kv``) into its one staging buffer and sends them; the lock keeps
them from eviction until ``release`` (sent, timed out or peer lost).

Decode instance (``import_kv``): the tokens ``[0, start)`` must already be in its tree (that is
what it told the prefill side); pages are allocated for the tokens it lacks now, the received
K/V is written into them, the tokens are inserted into the tree and the match is locked until
the decode request that owns the transfer has been admitted (``release``), or the transfer's
timeout passes. The decode request then either carries the prefill side's first token (the
usual case: it is emitted at once and its K/V computed by the step that samples the second
token, so no prompt token is computed twice) or, without it, computes the last prompt token
itself to get the first logits (vLLM's recompute of the last token).

Every function here touches the pool or the tree: run them on the engine thread only
(``Engine.call``). ``gather_kv`` only reads locked slots and may run on the sender's thread.

Flat KV layout of one transfer of ``n`` tokens (the staging buffers): ``[L, 2, n, H, D]``
(layer, K/V, token, KV head, head dim) packed at the start of a flat buffer, so one
point-to-point send moves it and every ``(layer, K|V)`` block is contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixgate.local_engine.kv_pool import KVPool
from prefixgate.local_engine.radix_cache import CacheHandle, RadixCache

__all__ = ["ExportedPrefix", "ImportedPrefix", "export_prefix", "gather_kv", "import_kv",
           "kv_view", "release"]


@dataclass(frozen=True)
class ExportedPrefix:
    """A locked prefix of the prefill side's tree: ``tokens`` (the matched ids), the ``slots`` of
    ``tokens[start:]`` (the part to send) and the lock's ``handle``."""

    tokens: list[int]
    start: int
    slots: list[int]
    handle: CacheHandle

    @property
    def num_transfer(self) -> int:
        """Tokens whose K/V is sent (``len(tokens) - start``)."""
        return len(self.tokens) - self.start


@dataclass(frozen=True)
class ImportedPrefix:
    """What ``import_kv`` did: ``handle`` (locked; None when nothing could be inserted),
    ``new_tokens`` (tokens whose K/V it wrote into fresh pages; ones the tree already held are
    skipped) and ``reason`` when it inserted nothing (``gap``: the tree no longer holds
    ``[0, start)``; ``no_room``: the pool cannot hold the pages)."""

    handle: CacheHandle | None
    new_tokens: int
    reason: str | None = None


def kv_view(flat: torch.Tensor, layers: int, n: int, heads: int, head_dim: int) -> torch.Tensor:
    """``flat[: L*2*n*H*D]`` viewed ``[L, 2, n, H, D]`` (no copy). Raises ``ValueError`` when
    ``flat`` is too small for ``n`` tokens."""
    size = layers * 2 * n * heads * head_dim
    if size > flat.numel():
        raise ValueError(f"staging buffer holds {flat.numel()} elements, {n} tokens need {size}")
    return flat[:size].view(layers, 2, n, heads, head_dim)


def export_prefix(cache: RadixCache, prompt: list[int], extra_key: bytes | None,
                  start: int) -> ExportedPrefix | None:
    """Lock the tree's match of ``prompt`` (its last token included: the prefill request
    computed it) and return the part from ``start`` on; None when the match does not reach past
    ``start`` (the decode side holds all of it: nothing to send).

    ``start`` is the decode side's cached length (its ``/v1/cache/match``); it is lowered to a
    page boundary. The caller must ``release(cache, result.handle)`` exactly once.
    """
    if start < 0:
        raise ValueError("start must be >= 0")
    start -= start % cache.page_size
    match = cache.match_prefix(prompt, extra_key)
    if match.handle.cached_len <= start:
        return None
    cache.lock(match.handle)
    n = match.handle.cached_len
    return ExportedPrefix(tokens=list(prompt[:n]), start=start, slots=list(match.slots[start:n]),
                          handle=match.handle)


def gather_kv(pool: KVPool, slots: list[int], out: torch.Tensor) -> None:
    """Copy the K/V of ``slots`` into ``out`` ``[L, 2, len(slots), H, D]`` (``kv_view``)."""
    idx = torch.tensor(slots, dtype=torch.int64, device=pool.k[0].device)
    for layer in range(len(pool.k)):
        torch.index_select(pool.k[layer], 0, idx, out=out[layer, 0])
        torch.index_select(pool.v[layer], 0, idx, out=out[layer, 1])


def import_kv(pool: KVPool, cache: RadixCache, tokens: list[int], extra_key: bytes | None,
              start: int, kv: torch.Tensor) -> ImportedPrefix:
    """Insert ``tokens`` into the tree with the K/V of ``tokens[start:]`` from ``kv``
    ``[L, 2, len(tokens) - start, H, D]``, and lock the result (``release`` it once).

    Pages are taken only for the tokens the tree lacks now (free pages first, then LRU eviction
    of unlocked leaves, never of the locked prefix). ``start`` and ``len(tokens)`` must be page
    aligned (both sides share ``page_size``). Raises ``ValueError`` on a shape mismatch.
    """
    ps = cache.page_size
    n = len(tokens) - start
    if n <= 0 or start % ps or len(tokens) % ps:
        raise ValueError(f"import of tokens [{start}, {len(tokens)}) is empty or not page aligned")
    if kv.shape[2] != n or kv.shape[0] != len(pool.k):
        raise ValueError(f"KV of shape {tuple(kv.shape)} for {n} tokens, {len(pool.k)} layers")
    if kv.device != pool.k[0].device:  # a link staged through host memory
        kv = kv.to(pool.k[0].device)
    match = cache.match_prefix(tokens, extra_key)
    have = match.handle.cached_len
    if have < start:
        return ImportedPrefix(None, 0, "gap")
    if have == len(tokens):
        cache.lock(match.handle)
        return ImportedPrefix(match.handle, 0)
    cache.lock(match.handle)  # the part we keep must survive the eviction below
    need = len(tokens) - have
    short = need - pool.free_slots
    if short > 0:
        pool.free(cache.evict(short))
    if pool.free_slots < need:
        cache.unlock(match.handle)
        return ImportedPrefix(None, 0, "no_room")
    new = pool.page_slots(pool.alloc_pages(need // ps))
    idx = torch.tensor(new, dtype=torch.int64, device=pool.k[0].device)
    off = have - start
    for layer in range(len(pool.k)):
        pool.write(layer, idx, kv[layer, 0, off:], kv[layer, 1, off:])
    prefix = cache.insert(tokens, list(match.slots) + new, extra_key)
    assert prefix == have, "the tree changed off the engine thread"
    cache.unlock(match.handle)
    full = cache.match_prefix(tokens, extra_key)
    cache.lock(full.handle)
    return ImportedPrefix(full.handle, need)


def release(cache: RadixCache, handle: CacheHandle) -> None:
    """Drop an export's or import's lock: its pages become evictable (freed on demand)."""
    cache.unlock(handle)
