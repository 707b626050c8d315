"""Continuous batching with chunked prefill, prefix-cache admission and retraction.

Each ``schedule()`` builds one forward step within ``max_num_batched_tokens``, in this order:

1. **Decode**: every running request that needs one token gets it. If the KV pool is short, the
   radix tree's unlocked leaves are evicted (LRU); if still short, the most recently admitted
   requests are *retracted*: their computed KV goes to the radix tree (so re-admission is mostly
   a cache hit), their slots are released and they return to the front of the waiting queue with
   their completion so far. Nothing is failed for lack of memory (vLLM's recompute preemption).
2. **Chunked prefill** of running requests whose prompt is not fully computed: at most
   ``chunk_size`` tokens each, within the remaining budget, so long prompts interleave with
   decode steps instead of stalling them (Sarathi / vLLM chunked prefill).
3. **Admission** from the waiting queue while budget, rows and memory last. The queue is ordered
   by longest cached prefix first when it holds several requests (SGLang's LPM policy, ties by
   arrival). A request is matched against the radix tree on all but its last token (there must be
   a token to compute to get logits), the match is locked, and only the rest is prefilled. A
   request sharing a long uncached prefix with a prompt still being prefilled waits one round for
   that prompt to enter the tree, so a shared prefix is computed once (SGLang's in-batch prefix
   check).

A prompt's KV enters the radix tree as soon as its prefill completes (not only at finish), and the
whole computed sequence enters it when the request finishes or is retracted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from prefixgate.local_engine.kv_pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.radix_cache import RadixCache, common_prefix_len
from prefixgate.local_engine.sequence import Sequence, Status

LPM_MAX_QUEUE = 128      # above this many waiting requests, sorting costs more than it saves
DEFER_MIN_SHARED = 32    # tokens of shared uncached prefix that justify waiting one round


@dataclass
class ScheduledSeq:
    """``n`` new tokens of ``seq`` starting at token ``start`` (slots already allocated)."""

    seq: Sequence
    start: int
    n: int


@dataclass
class SchedulerStats:
    """Monotonic counters (tokens) for ``Engine.stats``."""

    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    retractions: int = 0
    evicted_slots: int = 0


class Scheduler:
    """Owns the waiting queue, the running batch, slot allocation and the radix tree."""

    def __init__(self, pool: KVPool, table: ReqToTokenTable, cache: RadixCache | None,
                 max_num_batched_tokens: int, chunk_size: int, max_running: int) -> None:
        self.pool = pool
        self.table = table
        self.cache = cache
        self.budget = max_num_batched_tokens
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self.ps = pool.page_size

    # -- queue --------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new request (its prompt tokens count toward ``stats.prompt_tokens``)."""
        self.waiting.append(seq)
        self.stats.prompt_tokens += seq.num_prompt

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove a request wherever it is; returns it (finished, reason ``abort``) or None."""
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.status, seq.finish_reason = Status.FINISHED, "abort"
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                seq.finish_reason = "abort"
                self.finish(seq)
                return seq
        return None

    # -- memory -------------------------------------------------------------------------------
    def _pages_needed(self, seq: Sequence, n: int) -> int:
        spare = (-len(seq.slots)) % self.ps
        need = max(0, n - spare)
        return -(-need // self.ps)

    def _reserve(self, pages: int) -> bool:
        """Make ``pages`` free pages available, evicting unlocked tree leaves if needed."""
        short = pages * self.ps - self.pool.free_slots
        if short > 0 and self.cache is not None:
            freed = self.cache.evict(short)
            self.stats.evicted_slots += len(freed)
            self.pool.free(freed)
        return self.pool.free_slots >= pages * self.ps

    def _grow(self, seq: Sequence, n: int) -> None:
        """Allocate slots for ``seq``'s next ``n`` tokens (room must be reserved)."""
        start = len(seq.slots)
        spare = (-start) % self.ps
        new = [seq.slots[-1] + 1 + i for i in range(min(spare, n))] if spare else []
        pages = self.pool.alloc_pages(self._pages_needed(seq, n))
        new += self.pool.page_slots(pages)[: n - len(new)]
        seq.slots.extend(new)
        assert seq.row is not None
        self.table.set(seq.row, start, new)

    def _release_slots(self, seq: Sequence) -> None:
        """Hand ``seq``'s computed KV to the tree (if enabled), drop its lock, free the rest."""
        own_from = seq.num_tree_tokens
        if self.cache is not None and seq.num_computed > 0:
            tokens = seq.token_ids[: seq.num_computed]
            slots = seq.slots[: seq.num_computed]
            prefix = self.cache.insert(tokens, slots, seq.extra_key)
            aligned = seq.num_computed - seq.num_computed % self.ps
            self.pool.free(seq.slots[own_from:prefix])  # duplicates of what the tree holds
            own_from = max(aligned, own_from)
        if seq.handle is not None and self.cache is not None:
            self.cache.unlock(seq.handle)
        self.pool.free(seq.slots[own_from:])
        seq.slots, seq.handle, seq.num_tree_tokens, seq.num_computed = [], None, 0, 0
        if seq.row is not None:
            self.table.release(seq.row)
            seq.row = None

    def cache_prompt(self, seq: Sequence) -> None:
        """Insert ``seq``'s computed tokens into the tree now and re-lock the longer match.

        Other requests with the same prefix can then reuse it while ``seq`` still decodes.
        """
        if self.cache is None or seq.num_computed == 0:
            return
        tokens = seq.token_ids[: seq.num_computed]
        prefix = self.cache.insert(tokens, seq.slots[: seq.num_computed], seq.extra_key)
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

    def retract(self, seq: Sequence) -> None:
        """Send a running request back to the front of the queue, keeping its completion."""
        self.running.remove(seq)
        self._release_slots(seq)
        seq.prompt_cached = False
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.stats.retractions += 1

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) request at once."""
        if seq in self.running:
            self.running.remove(seq)
        self._release_slots(seq)
        seq.status = Status.FINISHED

    # -- admission ----------------------------------------------------------------------------
    def _order_waiting(self) -> list[Sequence]:
        queue = list(self.waiting)
        if self.cache is None or len(queue) < 2 or len(queue) > LPM_MAX_QUEUE:
            return queue
        hit = {id(s): self.cache.peek_prefix_len(s.token_ids[:-1], s.extra_key) for s in queue}
        return sorted(queue, key=lambda s: (-hit[id(s)], s.arrival))

    def _should_defer(self, seq: Sequence, cached: int) -> bool:
        """True when a running request whose prompt is not yet in the tree shares a long
        uncached prefix with ``seq``: admitting ``seq`` now would compute that prefix twice."""
        if self.cache is None:
            return False
        mine = seq.token_ids[:-1]
        for other in self.running:
            if other.prompt_cached or other.extra_key != seq.extra_key:
                continue
            shared = common_prefix_len(mine, other.token_ids[: other.num_prompt])
            if shared - cached >= max(DEFER_MIN_SHARED, self.ps):
                return True
        return False

    def _admit(self, seq: Sequence) -> None:
        seq.row = self.table.acquire()
        if self.cache is not None:
            match = self.cache.match_prefix(seq.token_ids[:-1], seq.extra_key)
            self.cache.lock(match.handle)
            seq.handle, seq.slots = match.handle, list(match.slots)
            seq.num_tree_tokens = seq.num_computed = match.handle.cached_len
            self.table.set(seq.row, 0, seq.slots)
        seq.first_admission = seq.cached_tokens is None
        if seq.first_admission:
            seq.cached_tokens = min(seq.num_computed, seq.num_prompt)
            self.stats.cache_hit_tokens += seq.cached_tokens
        seq.status = Status.RUNNING
        self.waiting.remove(seq)
        self.running.append(seq)

    def _unadmit(self, seq: Sequence) -> None:
        """Undo ``_admit`` of a request that got no room (nothing was computed for it)."""
        self.running.remove(seq)
        self._release_slots(seq)
        if seq.first_admission:
            self.stats.cache_hit_tokens -= seq.cached_tokens or 0
            seq.cached_tokens = None
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    # -- the step -----------------------------------------------------------------------------
    def schedule(self) -> list[ScheduledSeq]:
        """Pick this step's work and allocate its slots. Prefill chunks first, then decodes."""
        budget = self.budget
        decodes = [s for s in self.running if s.num_uncomputed == 1]
        # 1. decode: one token each; retract newest requests while memory is short
        while decodes and not self._reserve(sum(self._pages_needed(s, 1) for s in decodes)):
            victim = self.running[-1]
            if victim in decodes:
                decodes.remove(victim)
            self.retract(victim)
        decodes = decodes[:budget]
        for s in decodes:
            self._grow(s, 1)
        budget -= len(decodes)
        # 2. chunked prefill of admitted requests
        prefills: list[ScheduledSeq] = []
        for s in list(self.running):  # a copy: making room may retract others
            if budget <= 0 or s.num_uncomputed <= 1 or s.status is not Status.RUNNING:
                continue
            n = min(s.num_uncomputed, self.chunk_size, budget)
            if not self._reserve(self._pages_needed(s, n)):
                if decodes or prefills:
                    break
                others = [o for o in self.running if o is not s]
                while others and not self._reserve(self._pages_needed(s, n)):
                    self.retract(others.pop())
                if not self._reserve(self._pages_needed(s, n)):
                    break
            prefills.append(ScheduledSeq(s, len(s.slots), n))
            self._grow(s, n)
            budget -= n
        # 3. admission
        for seq in self._order_waiting():
            if budget <= 0 or len(self.running) >= self.max_running or self.table.free_rows == 0:
                break
            cached = 0
            if self.cache is not None:
                cached = self.cache.peek_prefix_len(seq.token_ids[:-1], seq.extra_key)
            if self._should_defer(seq, cached):
                continue
            self._admit(seq)  # locks its cached prefix first: making room cannot evict it
            n = min(seq.num_uncomputed, self.chunk_size, budget)
            if not self._reserve(self._pages_needed(seq, n)):
                self._unadmit(seq)
                break
            start = len(seq.slots)
            self._grow(seq, n)
            item = ScheduledSeq(seq, start, n)
            if n == 1 and seq.num_uncomputed == 1 and start > 0:
                decodes.append(seq)
            else:
                prefills.append(item)
            budget -= n
        out = prefills + [ScheduledSeq(s, len(s.slots) - 1, 1) for s in decodes]
        for item in out:
            if item.n == 1 and item.start + 1 == len(item.seq.token_ids) and item.start > 0:
                self.stats.decode_tokens += 1
            else:
                self.stats.prefill_tokens += item.n
        return out

    def complete_step(self, batch: list[ScheduledSeq]) -> list[Sequence]:
        """Mark the step's tokens computed; cache prompts whose prefill just ended.

        Returns the requests that now have logits to sample from (all their tokens computed).
        """
        ready = []
        for item in batch:
            seq = item.seq
            seq.num_computed = item.start + item.n
            if not seq.prompt_cached and seq.num_computed >= seq.num_prompt:
                self.cache_prompt(seq)
                seq.prompt_cached = True
            if seq.num_computed == len(seq.token_ids):
                ready.append(seq)
        return ready
