"""Span reuse: take the K/V of a cached continuation across short changed spans, by copy.

A prompt whose radix match stops at position ``j`` (a clock, an id changed there) is matched
against the cached branches below the divergence (``RadixCache.continuations``) by the pure
aligner (``kv.span_match.align``). When a plan passes the gate (``SpanBounds``, and the content
gate: only value-like tokens differ, ``value_tokens_of``), the request
allocates ITS OWN slots for ``[j, plan end)``, the K/V of each re-aligned run is COPIED from the
old branch's slots into them (all layers, one gather + scatter per layer), and only the changed
spans and the tail are prefilled (``Sequence.filled`` marks the copied ranges, the scheduler
jumps over them).

Copy, not share: no slot is ever held by two branches, so the radix tree is untouched — its
lock_ref counts, ``evictable_size`` + ``protected_size``, eviction, the KV events, P/D export and
``check()`` work as before; the request's branch enters the tree when its prompt is computed,
like any other, under new block hashes. The old branch is locked for the length of the copy
(the same engine step: reserving room may evict, and must not evict the source).

Keys are stored after RoPE. A run whose position changed by ``d`` (the span before it
tokenized to a different length) has its keys re-rotated: RoPE is a rotation by angle
``p * inv_freq``, rotations compose, so ``K(p + d) = R(d) K(p)`` for the same key vector
(Su et al. 2021). Values carry no position. What stays approximate is the context: the reused
K/V were computed with the old span's tokens in view (measured: ``bench/span_reuse.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prefixgate.local_engine.kv.pool import KVPool
from prefixgate.local_engine.kv.radix_cache import RadixCache, TreeNode
from prefixgate.local_engine.kv.span_match import Run, SpanBounds, SpanPlan, align, value_like_tokens
from prefixgate.local_engine.model.llama import apply_rope, rope_tables_signed

MAX_BRANCHES = 4  # cached continuations examined per tree node, most recently used first
ANCESTORS = 4     # tree nodes examined per admission: the match's node and its ancestors


@dataclass(frozen=True)
class SpanCopy:
    """What to copy: ``src`` old slots → ``dst`` new slots, ``shift`` per row (RoPE d)."""

    src: list[int]
    dst: list[int]
    shift: list[int]


class SpanReuse:
    """The span-reuse policy of one engine: the gate's bounds and the model's RoPE frequencies.

    ``inv_freq [head_dim/2]`` (``model.llama.rope_inv_freq``): re-rotation of shifted keys;
    None refuses any run whose position shift is not 0. ``changeable`` (optional): returns the
    token ids a changed span may consist of (``kv.span_match.value_like_tokens``: the content
    gate); None: no content gate.
    """

    def __init__(self, bounds: SpanBounds, inv_freq: torch.Tensor | None,
                 max_branches: int = MAX_BRANCHES,
                 changeable: Callable[[], frozenset[int]] | None = None) -> None:
        self.bounds = bounds
        self.inv_freq = None if inv_freq is None else inv_freq.to(torch.float64)
        self.max_branches = max_branches
        self._changeable_fn = changeable
        self._changeable: frozenset[int] | None = None

    def changeable(self) -> Callable[[int], bool] | None:
        """The content gate's test (built on first use from ``changeable()``), or None."""
        if self._changeable_fn is None:
            return None
        if self._changeable is None:
            self._changeable = self._changeable_fn()
        return self._changeable.__contains__

    def plan(self, cache: RadixCache, node: TreeNode, prompt: list[int], j: int
             ) -> tuple[SpanPlan, list[int], TreeNode, int] | None:
        """Best plan for ``prompt`` (its tokens, last one excluded) matched up to ``j`` at
        ``node``: ``(plan, old slots, deepest old node, offset)``, plan coordinates relative to
        ``j`` on both sides (old run ``r`` is ``old_slots[r.old_start + offset:]``); None when no
        continuation passes the gate (the most reused tokens wins).

        Candidates: the continuations below ``node``, and below each ancestor at most
        ``max_span_tokens`` shallower (``ANCESTORS`` levels): with several sessions in the tree
        the longest match may run into another session's branch (a clock value they share),
        while the request's own previous turn diverged a few tokens earlier. Tokens before
        ``j`` already have the tree's exact K/V: runs are trimmed to start at ``j`` or later.
        """
        b = self.bounds
        if len(prompt) - j < b.min_anchor_tokens:
            return None
        best: tuple[SpanPlan, list[int], TreeNode, int] | None = None
        ok = self.changeable()
        n: TreeNode | None = node
        came: TreeNode | None = None
        k = j
        for _ in range(ANCESTORS):
            if n is None or j - k > b.max_span_tokens:
                break
            new = prompt[k:]
            max_len = len(new) + b.max_spans * b.max_span_tokens
            for tokens, slots, deepest in cache.continuations(n, max_len, self.max_branches, came):
                p = align(new, tokens, b, ok)
                if p is not None:
                    p = _from(p, j - k, b.min_anchor_tokens)
                if p is not None and self.inv_freq is None:
                    p = _unshifted_prefix(p)
                if p is not None and (best is None or p.reused_tokens > best[0].reused_tokens):
                    best = (p, slots, deepest, j - k)
            if n.is_root:
                break
            came, k, n = n, k - len(n.key), n.parent
        return best

    @staticmethod
    def copies(plan: SpanPlan, old_slots: list[int], new_slots: list[int],
               offset: int = 0) -> SpanCopy:
        """Row-wise copy list of ``plan`` (``new_slots[i]``: the slot of new token ``i`` after
        the divergence point; old run ``r`` at ``old_slots[r.old_start + offset:]``)."""
        src: list[int] = []
        dst: list[int] = []
        shift: list[int] = []
        for r in plan.runs:
            src += old_slots[r.old_start + offset:r.old_start + offset + r.length]
            dst += new_slots[r.new_start:r.new_start + r.length]
            shift += [r.shift] * r.length
        return SpanCopy(src, dst, shift)

    def apply(self, pool: KVPool, copy: SpanCopy) -> None:
        """Run ``copy`` on ``pool`` (all layers): unshifted rows as plain copies, shifted rows
        with their keys re-rotated by ``rope_shift``."""
        device = pool.k[0].device
        same = [i for i, d in enumerate(copy.shift) if d == 0]
        moved = [i for i, d in enumerate(copy.shift) if d != 0]
        if same:
            pool.copy_slots(_idx([copy.src[i] for i in same], device),
                            _idx([copy.dst[i] for i in same], device))
        if moved:
            cos, sin = self.rope_shift([copy.shift[i] for i in moved], device)
            pool.copy_slots(_idx([copy.src[i] for i in moved], device),
                            _idx([copy.dst[i] for i in moved], device),
                            lambda k: apply_rope(k.float(), cos, sin))

    def rope_shift(self, shifts: list[int], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ``[R, 1, head_dim]`` fp32 rotating a post-RoPE key by ``d`` positions
        (``d`` may be negative), for ``model.llama.apply_rope``. Angles in float64, then fp32."""
        if self.inv_freq is None:
            raise ValueError("no RoPE frequencies: shifted runs cannot be re-rotated")
        d = torch.tensor(shifts, dtype=torch.float64)
        ang = d[:, None] * self.inv_freq[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        cos = emb.cos().float().unsqueeze(1).to(device)
        sin = rope_tables_signed(emb.sin()).float().unsqueeze(1).to(device)
        return cos, sin


def value_tokens_of(tokenizer: Any) -> frozenset[int]:
    """The value-like token ids of an HF tokenizer (``kv.span_match.value_like_tokens`` over its
    pieces): the content gate's alphabet (~0.1 s for a 49k vocabulary; built on first use)."""
    return value_like_tokens(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))


def _idx(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _unshifted_prefix(plan: SpanPlan) -> SpanPlan | None:
    """The runs of ``plan`` before the first shifted one (no RoPE tables to re-rotate with)."""
    runs = []
    for r in plan.runs:
        if r.shift != 0:
            break
        runs.append(r)
    return SpanPlan(tuple(runs), plan.spans[:len(runs)]) if runs else None


def _from(plan: SpanPlan, cut: int, min_len: int) -> SpanPlan | None:
    """``plan`` (relative to a point ``cut`` tokens before the match's end) re-based on the
    match's end, both sides (an old coordinate may be negative: the old run's index is
    ``old_start + cut``): runs trimmed to start there or later, shorter ones than ``min_len``
    dropped."""
    if cut == 0:
        return plan
    runs: list[Run] = []
    for r in plan.runs:
        skip = max(0, cut - r.new_start)
        if r.length - skip >= min_len:
            runs.append(Run(r.new_start + skip - cut, r.old_start + skip - cut, r.length - skip))
    if not runs:
        return None
    spans, i, o = [], 0, -cut
    for r in runs:
        if r.new_start > i or r.old_start > o:
            spans.append((i, r.new_start, o, r.old_start))
        i, o = r.new_start + r.length, r.old_start + r.length
    return SpanPlan(tuple(runs), tuple(spans))
