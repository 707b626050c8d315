"""KV memory management of the running requests: slots, pages, the radix tree, rollback.

After nano-vllm's block manager and mini-sglang's cache manager: the scheduler decides *what* runs,
this manager decides *where its K/V lives*. One request's slots (``seq.slots``, one per token,
``seq.token_ids[i]`` ↔ ``seq.slots[i]``) fall into these regions:

=============================  ===========================  ====================================
region (token indices)         owner                        released by
=============================  ===========================  ====================================
``[0, num_tree_tokens)``       radix tree, locked by        ``cache_seq``: unlock (the tree keeps
                               ``seq.handle``               them, evictable)
``[num_tree_tokens,            the request (computed K/V)   ``cache_seq``: inserted into the tree
num_computed)``                                             (page-aligned part) or freed when the
                                                            tree already held those tokens
``[num_computed, len(slots))`` the request (allocated for   ``rollback`` (rejected draft tokens)
                               this step's new tokens or    or ``cache_seq(finished=True)``: freed
                               draft tokens, not verified;
                               span reuse: copied K/V of
                               ``seq.filled`` and the spans
                               between them)
=============================  ===========================  ====================================

Span reuse (``span`` given, ``sched/span_reuse.py``): at admission a request whose match stops
at ``j`` may get its own slots for ``[j, plan end)`` at once, with the K/V of the re-aligned
runs copied in from another branch (locked during the copy); ``seq.filled`` lists those runs
and the scheduler prefills only the gaps. Those slots are the request's own like any other
computed ones, so the table above and its invariants are unchanged.

Invariants: a running request's tree region is locked (eviction cannot hand it to another
request); every pool page is in exactly one place (free list, tree, or one request's own region);
the tree never holds a token that was not verified — only ``token_ids[:num_computed]`` is ever
inserted, and ``rollback`` lowers ``num_computed`` before anything is inserted, so the K/V of
rejected draft tokens never reaches the tree. With ``page_size > 1`` a request owns whole pages
(the tail of its last page is spare room for its next tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import CacheHandle, RadixCache
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.sched.span_reuse import SpanReuse

InsertListener = Callable[[bytes | None, str, list[int]], None]


@dataclass
class KVStats:
    """Monotonic counters of the manager (slots)."""

    evicted_slots: int = 0
    rolled_back_slots: int = 0


class KVManager:
    """Allocates and releases the KV slots of running requests; owns the tree interplay.

    ``cache`` None disables prefix caching (every computed slot is freed at finish).
    ``stats`` (optional) receives the counters. ``on_insert`` listeners
    ``(extra_key, request_id, tokens)`` are told of every token sequence
    inserted into the tree (the suffix drafter's index listens here). ``span`` (optional):
    span reuse at admission (``sched/span_reuse.py``); None: prefix matches only.
    """

    def __init__(self, pool: KVPool, table: ReqToTokenTable, cache: RadixCache | None,
                 stats: KVStats | None = None, span: SpanReuse | None = None) -> None:
        self.pool = pool
        self.table = table
        self.cache = cache
        self.ps = pool.page_size
        self.stats = stats if stats is not None else KVStats()
        self.on_insert: list[InsertListener] = []
        self.span = span

    # -- allocation ----------------------------------------------------------------------------
    def pages_needed(self, seq: Sequence, n: int) -> int:
        """Pages to allocate so ``seq`` can hold ``n`` more tokens (its last page's spare first)."""
        spare = (-len(seq.slots)) % self.ps
        need = max(0, n - spare)
        return -(-need // self.ps)

    def reserve(self, pages: int) -> bool:
        """Make ``pages`` free pages available, evicting unlocked tree leaves if needed."""
        short = pages * self.ps - self.pool.free_slots
        if short > 0 and self.cache is not None:
            freed = self.cache.evict(short)
            self.stats.evicted_slots += len(freed)
            self.pool.free(freed)
        return self.pool.free_slots >= pages * self.ps

    def grow(self, seq: Sequence, n: int) -> None:
        """Allocate slots for ``seq``'s next ``n`` tokens (room must be reserved first)."""
        start = len(seq.slots)
        spare = (-start) % self.ps
        new = [seq.slots[-1] + 1 + i for i in range(min(spare, n))] if spare else []
        pages = self.pool.alloc_pages(self.pages_needed(seq, n))
        new += self.pool.page_slots(pages)[: n - len(new)]
        seq.slots.extend(new)
        assert seq.row is not None
        self.table.set(seq.row, start, new)

    def rollback(self, seq: Sequence, keep: int) -> int:
        """Drop ``seq``'s slots from token ``keep`` on (rejected draft tokens); returns how many.

        ``keep`` must be ≥ ``num_tree_tokens`` (the tree region is never rolled back). Pages that
        no longer hold any kept token go back to the pool; the kept tail of a partly used page
        stays owned (spare room). ``num_computed`` is clipped to ``keep``.
        """
        if keep >= len(seq.slots):
            return 0
        if keep < seq.num_tree_tokens:
            raise ValueError("rollback into the radix-tree region")
        dropped = seq.slots[keep:]
        first_free = -(-keep // self.ps) * self.ps  # first slot index on a page with no kept token
        self.pool.free(seq.slots[first_free:])
        del seq.slots[keep:]
        seq.num_computed = min(seq.num_computed, keep)
        seq.filled = [(a, min(b, keep)) for a, b in seq.filled if a < keep]
        self.stats.rolled_back_slots += len(dropped)
        return len(dropped)

    # -- the tree ------------------------------------------------------------------------------
    def admit(self, seq: Sequence) -> int:
        """Lease a table row for ``seq`` and lock its longest cached prefix (all but the last
        token, so there is one to compute); with span reuse, copy the K/V of a re-aligned
        cached continuation after it (``_admit_spans``). Returns the tokens reused across a
        changed span (0 without span reuse). ``params.no_prefix_cache``: match nothing."""
        seq.row = self.table.acquire()
        if self.cache is None or getattr(seq.params, "no_prefix_cache", False):
            return 0
        match = self.cache.match_prefix(seq.token_ids[:-1], seq.extra_key)
        self.cache.lock(match.handle)
        seq.handle, seq.slots = match.handle, list(match.slots)
        seq.num_tree_tokens = seq.num_computed = match.handle.cached_len
        self.table.set(seq.row, 0, seq.slots)
        return self._admit_spans(seq) if self.span is not None else 0

    def _admit_spans(self, seq: Sequence) -> int:
        """Span reuse for a just-matched ``seq`` (module docstring): plan, lock the old branch,
        allocate ``[j, plan end)`` (evicting unlocked leaves if needed; no room: no reuse),
        copy, unlock; ``seq.filled`` gets the copied runs. Returns the reused tokens."""
        assert self.span is not None and self.cache is not None and seq.handle is not None
        j = seq.num_computed
        found = self.span.plan(self.cache, seq.handle.node, seq.token_ids[:seq.num_prompt - 1], j)
        if found is None:
            return 0
        plan, old_slots, deepest, offset = found
        hold = CacheHandle(deepest, 0)
        self.cache.lock(hold)  # the source must outlive the copy (reserve may evict)
        try:
            if not self.reserve(self.pages_needed(seq, plan.end)):
                return 0
            self.grow(seq, plan.end)
            self.span.apply(self.pool, self.span.copies(plan, old_slots, seq.slots[j:], offset))
        finally:
            self.cache.unlock(hold)
        seq.filled = [(j + r.new_start, j + r.new_start + r.length) for r in plan.runs]
        seq.skip_filled()
        return plan.reused_tokens

    def cache_seq(self, seq: Sequence, finished: bool) -> None:
        """Give ``seq``'s computed K/V to the radix tree.

        ``finished`` False (prompt just prefilled, request keeps running): insert the computed
        tokens and re-lock the longer match, so others reuse them while ``seq`` decodes (not
        for ``params.no_prefix_cache``: it never reads the tree's K/V).
        ``finished`` True (finished, aborted or retracted): insert, drop the lock, free every slot
        the tree did not take, release the table row; ``seq`` then holds nothing.
        """
        if finished:
            self._release(seq)
        else:
            self._cache_running(seq)

    def _inserted(self, seq: Sequence, n: int) -> None:
        for cb in self.on_insert:
            cb(seq.extra_key, seq.request_id, seq.token_ids[:n])

    def _release(self, seq: Sequence) -> None:
        own_from = seq.num_tree_tokens
        n = min(seq.num_computed, len(seq.token_ids))
        if self.cache is not None and n > 0:
            prefix = self.cache.insert(seq.token_ids[:n], seq.slots[:n], seq.extra_key)
            self._inserted(seq, n)
            aligned = n - n % self.ps
            self.pool.free(seq.slots[own_from:prefix])  # duplicates of what the tree holds
            own_from = max(aligned, own_from)
        if seq.handle is not None and self.cache is not None:
            self.cache.unlock(seq.handle)
        self.pool.free(seq.slots[own_from:])
        seq.slots, seq.handle, seq.num_tree_tokens, seq.num_computed = [], None, 0, 0
        seq.filled = []
        if seq.row is not None:
            self.table.release(seq.row)
            seq.row = None

    def _cache_running(self, seq: Sequence) -> None:
        if self.cache is None or seq.num_computed == 0:
            return
        if getattr(seq.params, "no_prefix_cache", False):
            return  # decodes on its own K/V only; it enters the tree at release
        tokens = seq.token_ids[: seq.num_computed]
        prefix = self.cache.insert(tokens, seq.slots[: seq.num_computed], seq.extra_key)
        self._inserted(seq, seq.num_computed)
        match = self.cache.match_prefix(tokens, seq.extra_key)
        self.cache.lock(match.handle)
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        dup_from, dup_to = seq.num_tree_tokens, max(prefix, seq.num_tree_tokens)
        self.pool.free(seq.slots[dup_from:dup_to])
        n = match.handle.cached_len
        seq.slots[:n] = match.slots
        assert seq.row is not None
        self.table.set(seq.row, dup_from, match.slots[dup_from:dup_to])
        seq.handle, seq.num_tree_tokens = match.handle, n
