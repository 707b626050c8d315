"""Attention of a packed ragged batch over K/V gathered from the KV pool.

A step's ``T`` new tokens are laid out as groups of consecutive rows. A group holds ``B``
sequences with ``n`` new tokens each (after padding) attending to ``L`` keys each (after padding):
all decode rows form one group (``n = 1``); each prefill chunk is its own group (``B = 1``).
Row ``t`` of sequence ``b`` (cached length ``c_b``) may attend to keys ``j <= c_b + t`` and
``j < c_b + n_b`` — the per-row causal mask over [cached prefix + new tokens].

Grouped-query attention without copying K/V per query head: the ``g = heads / kv_heads`` query
heads sharing a KV head are folded into the query-length axis, so SDPA sees
``q [B, kv_heads, g*n, D]`` against ``k, v [B, kv_heads, L, D]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttnGroup:
    """One SDPA call's worth of rows.

    ``start..end``: its rows in the packed batch. ``q_index [B*n]``: rows (relative to start)
    forming the padded ``[B, n]`` query grid, or None when the rows already form it.
    ``kv_flat [B*L]``: slots of each sequence's keys, padded. ``mask [B, 1, g*n, L]`` bool (True =
    attend) or None (all keys visible). ``out_index``: rows of the padded grid that are real, in
    packed order, or None when all are.
    """

    start: int
    end: int
    batch: int
    n: int
    kv_len: int
    kv_flat: torch.Tensor
    mask: torch.Tensor | None
    q_index: torch.Tensor | None = None
    out_index: torch.Tensor | None = None


@dataclass
class AttnMeta:
    """Per-step attention inputs shared by all layers.

    ``cos, sin [T, 1, head_dim]`` (RoPE at each row's position; ``sin`` with its first half
    negated, see ``model.apply_rope``), ``out_slots [T]`` (where each new
    token's K/V is written), ``groups`` covering rows ``0..T`` in order.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    out_slots: torch.Tensor
    groups: list[AttnGroup]
    gqa: int


def prefill_group(start: int, cached: int, n: int, slots: torch.Tensor, gqa: int,
                  device: torch.device) -> AttnGroup:
    """Group for one sequence's chunk of ``n`` new tokens after ``cached`` computed ones.

    ``slots [cached + n]`` are the slots of all its keys (prefix first). Mask row ``t`` of head
    fold ``j`` allows keys ``0 .. cached + t``.
    """
    length = cached + n
    if n == 1:
        mask = None
    else:
        q_pos = torch.arange(cached, length, device=device)
        mask = torch.arange(length, device=device)[None, :] <= q_pos[:, None]  # [n, L]
        if gqa > 1:
            mask = mask.repeat(gqa, 1)
        mask = mask.view(1, 1, gqa * n, length)
    return AttnGroup(start=start, end=start + n, batch=1, n=n, kv_len=length,
                     kv_flat=slots, mask=mask)


def decode_group(start: int, lengths: list[int], kv_index: torch.Tensor,
                 device: torch.device) -> AttnGroup:
    """Group of ``B`` decode rows (one new token each) with key lengths ``lengths``.

    ``kv_index [B, >= max(lengths)]`` holds each row's slots (tail padding is any valid slot).
    """
    b, lmax = len(lengths), max(lengths)
    kv = kv_index[:, :lmax]
    mask = None
    if min(lengths) != lmax:
        lens = torch.tensor(lengths, device=device)
        mask = (torch.arange(lmax, device=device)[None, :] < lens[:, None]).view(b, 1, 1, lmax)
    return AttnGroup(start=start, end=start + b, batch=b, n=1, kv_len=lmax,
                     kv_flat=kv.reshape(-1), mask=mask)


def verify_group(start: int, cached: list[int], ns: list[int], kv_index: torch.Tensor, gqa: int,
                 device: torch.device) -> AttnGroup:
    """Group of ``B`` decode rows carrying draft tokens: sequence ``b`` has ``ns[b]`` new rows
    (its newest token + drafts) after ``cached[b]`` computed tokens, packed back to back.

    Rows are padded to a ``[B, max(ns)]`` grid (a padded row repeats the sequence's last real
    row and is dropped after attention). Row ``t`` of ``b`` sees keys ``j <= cached[b] + t`` and
    ``j < cached[b] + ns[b]``. ``kv_index [B, >= max(cached + ns)]`` holds each one's slots.
    """
    b, n = len(ns), max(ns)
    lengths = [c + k for c, k in zip(cached, ns)]
    lmax = max(lengths)
    offsets = [0]
    for k in ns[:-1]:
        offsets.append(offsets[-1] + k)
    q_index = torch.tensor([o + min(t, k - 1) for o, k in zip(offsets, ns) for t in range(n)],
                           device=device)
    out_index = torch.tensor([i * n + t for i, k in enumerate(ns) for t in range(k)], device=device)
    q_pos = torch.tensor(cached, device=device)[:, None] + torch.arange(n, device=device)[None, :]
    keys = torch.arange(lmax, device=device)
    mask = (keys[None, None, :] <= q_pos[:, :, None]) & (
        keys[None, None, :] < torch.tensor(lengths, device=device)[:, None, None])  # [B, n, L]
    if gqa > 1:
        mask = mask.repeat(1, gqa, 1)
    return AttnGroup(start=start, end=start + sum(ns), batch=b, n=n, kv_len=lmax,
                     kv_flat=kv_index[:, :lmax].reshape(-1), mask=mask.view(b, 1, gqa * n, lmax),
                     q_index=q_index, out_index=out_index)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           meta: AttnMeta) -> torch.Tensor:
    """``q [T, heads, D]`` against the pool's ``k_cache, v_cache [S, kv_heads, D]`` → ``[T, heads*D]``.

    The new tokens' K/V must already be written to the pool (their slots are in each group's
    ``kv_flat``).
    """
    _, nh, d = q.shape
    nkv, g = k_cache.shape[1], meta.gqa
    outs = []
    if len(meta.groups) == 1 and meta.groups[0].n == 1:  # decode-only step: fewest ops
        grp = meta.groups[0]
        b, L = grp.batch, grp.kv_len
        kg = k_cache.index_select(0, grp.kv_flat).view(b, L, nkv, d).transpose(1, 2)
        vg = v_cache.index_select(0, grp.kv_flat).view(b, L, nkv, d).transpose(1, 2)
        if kg.dtype != q.dtype:
            kg, vg = kg.to(q.dtype), vg.to(q.dtype)
        o = F.scaled_dot_product_attention(q.view(b, nkv, g, d), kg, vg, attn_mask=grp.mask)
        return o.view(b, nh * d)
    for grp in meta.groups:
        qg = q[grp.start:grp.end]
        if grp.q_index is not None:
            qg = qg.index_select(0, grp.q_index)
        b, n, L = grp.batch, grp.n, grp.kv_len
        # [B*n, nkv*g, D] -> [B, nkv, g*n, D] (query head h = kv*g + j)
        qg = qg.view(b, n, nkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, nkv, g * n, d)
        kg = k_cache.index_select(0, grp.kv_flat).view(b, L, nkv, d).transpose(1, 2)
        vg = v_cache.index_select(0, grp.kv_flat).view(b, L, nkv, d).transpose(1, 2)
        if kg.dtype != qg.dtype:
            kg, vg = kg.to(qg.dtype), vg.to(qg.dtype)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=grp.mask)
        o = o.view(b, nkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(b * n, nh * d)
        if grp.out_index is not None:
            o = o.index_select(0, grp.out_index)
        outs.append(o)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
