"""P/D disaggregation, engine-thread side: take a prompt's KV out of the pool, put one in.

Prefill instance (``export_prefix``): the radix tree's match of the whole prompt is locked and
the slots of the tokens the decode side lacks (``[start, matched)``) are handed to the sender,
which gathers them (``gather_kv``) into its one staging buffer and sends them; the lock keeps
them from eviction until ``release`` (sent, timed out or peer lost).

Decode instance (``import_kv``): the tokens ``[0, start)`` must already be in its tree (that is
what it told the prefill side); pages are allocated for the tokens it lacks now, the received
K/V is written into them, the tokens are inserted into the tree and the match is locked until
the decode request that owns the transfer has been admitted (``release``), or the transfer's
timeout passes. The import may be staged (``reserve_import``, ``write_import`` in pieces,
``finish_import``; the engine steps between the pieces): the fresh pages are nobody's until
they enter the tree, so the running decodes never wait for a whole transfer's copy.
The decode request then either carries the prefill side's first token (the
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

from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.kv.radix_cache import CacheHandle, RadixCache

__all__ = ["ExportedPrefix", "ImportReservation", "ImportedPrefix", "cancel_import",
           "export_prefix", "finish_import", "gather_kv", "import_kv", "kv_view", "release",
           "reserve_import", "write_import"]


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


@dataclass(frozen=True)
class ImportReservation:
    """Pages taken for an import that is not in the tree yet (``reserve_import``): the kept
    prefix ``[0, have)`` is locked by ``handle``; ``slots`` (fresh pages) will hold the K/V of
    ``tokens[have:]``, which is ``kv[:, :, offset:]`` of the received transfer; ``kept`` are
    the prefix's own slots."""

    tokens: list[int]
    extra_key: bytes | None
    have: int
    offset: int
    kept: list[int]
    slots: list[int]
    handle: CacheHandle

    @property
    def num_new(self) -> int:
        """Tokens whose K/V goes into the fresh pages."""
        return len(self.slots)


def reserve_import(pool: KVPool, cache: RadixCache, tokens: list[int], extra_key: bytes | None,
                   start: int, n_kv: int) -> ImportReservation | ImportedPrefix:
    """First part of ``import_kv``: check the transfer (``tokens``, K/V of ``tokens[start:]``,
    ``n_kv`` tokens of it), lock what the tree holds and take pages for the rest. Returns an
    ``ImportedPrefix`` when there is nothing to write (the tree holds it all: locked; or
    ``gap`` / ``no_room``: nothing held), else the reservation to fill (``write_import``) and
    ``finish_import`` or ``cancel_import`` exactly once. Raises ``ValueError`` as ``import_kv``.
    """
    ps = cache.page_size
    n = len(tokens) - start
    if n <= 0 or start % ps or len(tokens) % ps:
        raise ValueError(f"import of tokens [{start}, {len(tokens)}) is empty or not page aligned")
    if n_kv != n:
        raise ValueError(f"KV of {n_kv} tokens for {n} tokens")
    match = cache.match_prefix(tokens, extra_key)
    have = match.handle.cached_len
    if have < start:
        return ImportedPrefix(None, 0, "gap")
    cache.lock(match.handle)  # the part we keep must survive the eviction below
    if have == len(tokens):
        return ImportedPrefix(match.handle, 0)
    need = len(tokens) - have
    short = need - pool.free_slots
    if short > 0:
        pool.free(cache.evict(short))
    if pool.free_slots < need:
        cache.unlock(match.handle)
        return ImportedPrefix(None, 0, "no_room")
    new = pool.page_slots(pool.alloc_pages(need // ps))
    return ImportReservation(list(tokens), extra_key, have, have - start, list(match.slots), new,
                             match.handle)


def write_import(pool: KVPool, res: ImportReservation, kv: torch.Tensor, lo: int, hi: int) -> None:
    """Write the K/V of ``tokens[have + lo : have + hi]`` (``kv`` ``[L, 2, n, H, D]``, the whole
    transfer) into the reservation's pages. Nothing reads those pages before ``finish_import``,
    so the writes may be spread over several engine steps."""
    if not 0 <= lo <= hi <= res.num_new:
        raise ValueError(f"rows [{lo}, {hi}) outside the {res.num_new} reserved")
    part = kv[:, :, res.offset + lo: res.offset + hi]
    if part.device != pool.k[0].device:  # a link staged through host memory: this piece only
        part = part.to(pool.k[0].device)
    idx = torch.tensor(res.slots[lo:hi], dtype=torch.int64, device=pool.k[0].device)
    for layer in range(len(pool.k)):
        pool.write(layer, idx, part[layer, 0], part[layer, 1])


def finish_import(pool: KVPool, cache: RadixCache, res: ImportReservation) -> ImportedPrefix:
    """Insert the written reservation into the tree and lock the whole prefix (``release`` it
    once). Pages for tokens another request inserted meanwhile are given back."""
    prefix = cache.insert(res.tokens, res.kept + res.slots, res.extra_key)
    if prefix > res.have:  # the tree grew over part of ours: those pages are duplicates
        pool.free(res.slots[: min(prefix, len(res.tokens)) - res.have])
    cache.unlock(res.handle)
    full = cache.match_prefix(res.tokens, res.extra_key)
    cache.lock(full.handle)
    return ImportedPrefix(full.handle, len(res.tokens) - max(prefix, res.have))


def cancel_import(pool: KVPool, cache: RadixCache, res: ImportReservation) -> None:
    """Give a reservation's pages back and unlock its kept prefix (the transfer is dropped)."""
    pool.free(res.slots)
    cache.unlock(res.handle)


def import_kv(pool: KVPool, cache: RadixCache, tokens: list[int], extra_key: bytes | None,
              start: int, kv: torch.Tensor) -> ImportedPrefix:
    """Insert ``tokens`` into the tree with the K/V of ``tokens[start:]`` from ``kv``
    ``[L, 2, len(tokens) - start, H, D]``, and lock the result (``release`` it once): the three
    steps of a staged import (``reserve_import``, ``write_import``, ``finish_import``) at once.

    Pages are taken only for the tokens the tree lacks now (free pages first, then LRU eviction
    of unlocked leaves, never of the locked prefix). ``start`` and ``len(tokens)`` must be page
    aligned (both sides share ``page_size``). Raises ``ValueError`` on a shape mismatch.
    """
    if kv.shape[0] != len(pool.k):
        raise ValueError(f"KV of shape {tuple(kv.shape)}, {len(pool.k)} layers")
    res = reserve_import(pool, cache, tokens, extra_key, start, int(kv.shape[2]))
    if isinstance(res, ImportedPrefix):
        return res
    write_import(pool, res, kv, 0, res.num_new)
    return finish_import(pool, cache, res)


def release(cache: RadixCache, handle: CacheHandle) -> None:
    """Drop an export's or import's lock: its pages become evictable (freed on demand)."""
    cache.unlock(handle)
