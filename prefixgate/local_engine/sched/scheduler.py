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
   **Priority** (vLLM's ``priority``, ``SamplingParams.priority``): a background request
   (priority > 0) is admitted, and its prefill chunks run, only in a step where no priority-0
   request waits or runs: background work (the proxy's meaning-guard trials) takes the engine's
   idle steps, so a client's prefill never shares a step with it and a client's decode steps
   never carry its prefill chunks. A background request already decoding when a client's
   arrives keeps its decode rows (one token each) until it finishes.
4. **Drafts** (speculative decoding, when a proposer is given): each decoding request may carry
   draft tokens in the rows left under the budget; their slots are allocated now (without
   evicting locked KV or retracting anyone) and rolled back by ``accept_draft`` after
   verification.

A prompt's KV enters the radix tree as soon as its prefill completes (not only at finish), and the
whole computed sequence enters it when the request finishes or is retracted. Where K/V lives and
how it returns to the tree is ``kv_manager.KVManager``'s business (its docstring has the region
table); speculative draft tokens ride on decode items and are verified in the same step.

Span reuse (``span`` given): admission may copy a re-aligned cached continuation's K/V after
the matched prefix (``kv_manager``); a prefill chunk then runs from ``num_computed`` up to the
next copied range at most (``Sequence.chunk_limit``) and ``complete_step`` jumps over it
(``Sequence.skip_filled``): chunk the first changed span, jump, the next span, jump, the tail.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixgate.local_engine.kv.pool import KVPool, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import RadixCache, common_prefix_len
from prefixgate.local_engine.sched.kv_manager import KVManager, KVStats
from prefixgate.local_engine.sched.sequence import Sequence, Status
from prefixgate.local_engine.sched.span_reuse import SpanReuse

if TYPE_CHECKING:  # the drafter layer sits above the scheduler; it only names the type here
    from prefixgate.local_engine.spec.drafters import Draft

LPM_MAX_QUEUE = 128      # above this many waiting requests, sorting costs more than it saves
DEFER_MIN_SHARED = 32    # tokens of shared uncached prefix that justify waiting one round


@dataclass
class ScheduledSeq:
    """``n`` tokens of ``seq`` starting at token ``start`` (slots already allocated), then the
    ``draft`` tokens to verify after them (decode steps only; their slots follow).

    ``is_decode`` is decided once, by the scheduler: the request computes only its newest sampled
    token (plus drafts). Every consumer (model runner, stats, timing) reads this flag.
    """

    seq: Sequence
    start: int
    n: int
    is_decode: bool = False
    draft: Draft | None = None

    @property
    def num_rows(self) -> int:
        """Rows of this item in the packed forward batch (tokens + draft tokens)."""
        return self.n + (len(self.draft.tokens) if self.draft else 0)


@dataclass
class SchedulerStats(KVStats):
    """Monotonic counters (tokens) for ``Engine.stats`` (the KV manager's slot counters too)."""

    prompt_tokens: int = 0
    cache_hit_tokens: int = 0
    span_reused_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    retractions: int = 0


ProposeFn = Callable[[list[Sequence], int], "list[Draft | None]"]


class Scheduler:
    """Owns the waiting queue and the running batch; KV memory goes through ``self.kv``.

    ``span``: span reuse at admission (None: prefix matches only)."""

    def __init__(self, pool: KVPool, table: ReqToTokenTable, cache: RadixCache | None,
                 max_num_batched_tokens: int, chunk_size: int, max_running: int,
                 span: SpanReuse | None = None) -> None:
        self.stats = SchedulerStats()
        self.kv = KVManager(pool, table, cache, self.stats, span if cache is not None else None)
        self.pool = pool
        self.table = table
        self.cache = cache
        self.budget = max_num_batched_tokens
        self.chunk_size = chunk_size
        self.max_running = max_running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

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

    # -- lifecycle ------------------------------------------------------------------------------
    def retract(self, seq: Sequence) -> None:
        """Send a running request back to the front of the queue, keeping its completion."""
        self.running.remove(seq)
        self.kv.cache_seq(seq, finished=True)
        seq.prompt_cached = False
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.stats.retractions += 1

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) request at once."""
        if seq in self.running:
            self.running.remove(seq)
        self.kv.cache_seq(seq, finished=True)
        seq.status = Status.FINISHED

    # -- admission ----------------------------------------------------------------------------
    def _order_waiting(self) -> list[Sequence]:
        """The waiting queue in admission order: clients' requests before background ones
        (``priority``, lowest value first; module docstring), then longest cached prefix first
        (LPM), then arrival."""
        queue = list(self.waiting)
        if any(s.params.priority for s in queue):
            queue.sort(key=lambda s: s.params.priority)  # stable: arrival order within a rank
        if self.cache is None or len(queue) < 2 or len(queue) > LPM_MAX_QUEUE:
            return queue
        hit = {id(s): self.cache.peek_prefix_len(s.token_ids[:-1], s.extra_key) for s in queue}
        return sorted(queue, key=lambda s: (s.params.priority, -hit[id(s)], s.arrival))

    def _client_busy(self) -> bool:
        """True while a client's (priority-0) request waits or runs."""
        return any(s.params.priority == 0 for s in self.waiting) or any(
            s.params.priority == 0 for s in self.running)

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
            if shared - cached >= max(DEFER_MIN_SHARED, self.kv.ps):
                return True
        return False

    def _admit(self, seq: Sequence) -> None:
        reused = self.kv.admit(seq)
        seq.first_admission = seq.cached_tokens is None
        if seq.first_admission:
            seq.cached_tokens = min(seq.num_tree_tokens + reused, seq.num_prompt)
            seq.span_reused_tokens = reused
            self.stats.cache_hit_tokens += seq.cached_tokens
            self.stats.span_reused_tokens += reused
        seq.status = Status.RUNNING
        self.waiting.remove(seq)
        self.running.append(seq)

    def _unadmit(self, seq: Sequence) -> None:
        """Undo ``_admit`` of a request that got no room (nothing was computed for it)."""
        self.running.remove(seq)
        self.kv.cache_seq(seq, finished=True)
        if seq.first_admission:
            self.stats.cache_hit_tokens -= seq.cached_tokens or 0
            self.stats.span_reused_tokens -= seq.span_reused_tokens
            seq.cached_tokens, seq.span_reused_tokens = None, 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    # -- the step -----------------------------------------------------------------------------
    def _pages(self, seq: Sequence, n: int) -> int:
        """Pages to allocate for a chunk of ``n`` tokens from ``seq.prefill_start`` (slots that
        span reuse already allocated ahead need none)."""
        return self.kv.pages_needed(seq, max(0, seq.prefill_start + n - len(seq.slots)))

    def _grow(self, seq: Sequence, n: int) -> None:
        """Allocate the slots a chunk of ``n`` tokens from ``seq.prefill_start`` lacks."""
        self.kv.grow(seq, max(0, seq.prefill_start + n - len(seq.slots)))

    def _attach_drafts(self, decodes: list[Sequence], budget: int,
                       propose: ProposeFn | None) -> list[ScheduledSeq]:
        """Decode items for ``decodes`` (one slot each already grown), with drafts where the
        proposer gives one and memory allows (a draft never causes eviction of locked KV or a
        retraction: without room it is dropped)."""
        drafts: list[Draft | None] = [None] * len(decodes)
        if propose is not None and decodes and budget > 0:
            drafts = propose(decodes, budget)
        items = []
        for s, d in zip(decodes, drafts):
            start = len(s.slots) - 1
            if d is not None and d.tokens:
                k = min(len(d.tokens), budget)
                if k > 0 and self.kv.reserve(self.kv.pages_needed(s, k)):
                    d = d.truncated(k)
                    self.kv.grow(s, k)
                    budget -= k
                else:
                    d = None
            else:
                d = None
            items.append(ScheduledSeq(s, start, 1, is_decode=True, draft=d))
        return items

    def schedule(self, propose: ProposeFn | None = None) -> list[ScheduledSeq]:
        """Pick this step's work and allocate its slots. Prefill chunks first, then decodes.

        ``propose(decoding_requests, spare_budget)`` (speculative decoding) returns one draft
        (or None) per decoding request; its tokens are verified in this same step.
        """
        budget = self.budget
        decodes = [s for s in self.running if s.num_uncomputed == 1 and s.num_computed > 0]
        # 1. decode: one token each; retract newest requests while memory is short
        while decodes and not self.kv.reserve(sum(self.kv.pages_needed(s, 1) for s in decodes)):
            victim = self.running[-1]
            if victim in decodes:
                decodes.remove(victim)
            self.retract(victim)
        decodes = decodes[:budget]
        for s in decodes:
            self.kv.grow(s, 1)
        budget -= len(decodes)
        # 2. chunked prefill of admitted requests (background ones only with no client's about)
        prefills: list[ScheduledSeq] = []
        hold_background = self._client_busy()
        for s in list(self.running):  # a copy: making room may retract others
            if budget <= 0 or s in decodes or s.status is not Status.RUNNING:
                continue
            if hold_background and s.params.priority > 0:
                continue
            if s.num_uncomputed < 1:
                continue
            n = min(s.chunk_limit(), self.chunk_size, budget)
            if not self.kv.reserve(self._pages(s, n)):
                if decodes or prefills:
                    break
                others = [o for o in self.running if o is not s]
                while others and not self.kv.reserve(self._pages(s, n)):
                    self.retract(others.pop())
                if not self.kv.reserve(self._pages(s, n)):
                    break
            prefills.append(ScheduledSeq(s, s.prefill_start, n))
            self._grow(s, n)
            budget -= n
        # 3. admission
        for seq in self._order_waiting():
            if budget <= 0 or len(self.running) >= self.max_running or self.table.free_rows == 0:
                break
            if seq.params.priority > 0 and (hold_background or self._client_busy()):
                break  # background after clients (_order_waiting): none admitted beside one
            cached = 0
            if self.cache is not None:
                cached = self.cache.peek_prefix_len(seq.token_ids[:-1], seq.extra_key)
            if self._should_defer(seq, cached):
                continue
            self._admit(seq)  # locks its cached prefix first: making room cannot evict it
            n = min(seq.chunk_limit(), self.chunk_size, budget)
            if not self.kv.reserve(self._pages(seq, n)):
                self._unadmit(seq)
                break
            start = seq.prefill_start
            self._grow(seq, n)
            prefills.append(ScheduledSeq(seq, start, n, is_decode=n == 1 and start > 0
                                         and seq.num_uncomputed == 1))
            budget -= n
        decode_items = self._attach_drafts(decodes, budget, propose)
        out = prefills + decode_items
        for item in out:
            if item.is_decode:
                self.stats.decode_tokens += item.num_rows
            else:
                self.stats.prefill_tokens += item.n
        return out

    def complete_step(self, batch: list[ScheduledSeq]) -> list[Sequence]:
        """Mark the step's tokens computed; cache prompts whose prefill just ended.

        Draft tokens are not marked computed here: the caller verifies them and calls
        ``accept_draft``. Returns the requests that now have logits to sample from.
        """
        ready = []
        for item in batch:
            seq = item.seq
            seq.num_computed = item.start + item.n
            seq.skip_filled()
            if not seq.prompt_cached and seq.num_computed >= seq.num_prompt:
                self.kv.cache_seq(seq, finished=False)
                seq.prompt_cached = True
            if seq.num_computed == len(seq.token_ids):
                ready.append(seq)
        return ready

    def accept_draft(self, seq: Sequence, accepted: list[int]) -> None:
        """Keep the K/V of the first ``len(accepted)`` draft tokens, roll back the rest.

        Call before appending ``accepted`` (and the token sampled after them) to ``seq``: the
        accepted drafts' K/V were computed in the verification step.
        """
        keep = seq.num_computed + len(accepted)
        self.kv.rollback(seq, keep)
        seq.num_computed = keep
