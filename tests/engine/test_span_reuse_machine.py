"""Span reuse under the scheduler: the slot ledger, the tree's invariants and the copied K/V.

A hypothesis state machine interleaves admissions whose prompts re-align with cached branches
across short changed spans (equal and different lengths) with plain prompts, steps under pool
pressure (eviction, retraction), chunked prefill and aborts mid-prefill. After every rule: the
slot ledger of ``test_scheduler_pool_pressure.conserved`` (each page in exactly one place, a
running request's tree prefix locked), ``RadixCache.check()``, and every slot of the tree and
of every running request holds the K/V of its token at its position (``span_fake``: so a copy
is right only if shifted keys were re-rotated). A freed slot is never one the tree holds.
"""

from __future__ import annotations

import random

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from prefixgate.local_engine.kv.span_match import SpanBounds
from prefixgate.local_engine.sched.scheduler import Scheduler
from prefixgate.local_engine.sched.sequence import Status
from tests.engine.span_fake import check_kv, check_kv_range, check_tree_kv, make, request, step
from tests.engine.test_scheduler_pool_pressure import _tree_slots, conserved

BASES = [list(range(100, 160)), list(range(300, 350))]


def guard_free(s: Scheduler) -> None:
    """Wrap ``pool.free``: freeing a slot the tree still holds is a bug (the old branch's slots
    must outlive every lock, and eviction unlinks a leaf before freeing it)."""
    inner = s.pool.free

    def free(slots: list[int]) -> None:
        assert s.cache is not None
        held = _tree_slots(s.cache)
        assert not [x for x in slots if x in held], "freed a slot the radix tree holds"
        inner(slots)

    s.pool.free = free  # type: ignore[method-assign]


class SpanMachine(RuleBasedStateMachine):
    """Requests built from two bases with small edits (changed spans), run step by step."""

    @initialize(page=st.sampled_from([1, 2]), slots=st.sampled_from([96, 160, 400]),
                chunk=st.sampled_from([4, 16, 64]))
    def setup(self, page: int, slots: int, chunk: int) -> None:
        self.s = make(slots=slots, page=page, budget=48, chunk=chunk, running=3,
                      bounds=SpanBounds(2, 6, 4))
        guard_free(self.s)
        self.n = 0

    @rule(base=st.integers(0, 1), seed=st.integers(0, 10 ** 6), edits=st.integers(0, 3),
          tail=st.integers(1, 12), max_tokens=st.integers(1, 6))
    def add(self, base: int, seed: int, edits: int, tail: int, max_tokens: int) -> None:
        rng = random.Random(seed)
        prompt = list(BASES[base])
        for _ in range(edits):  # replace 0..3 tokens by 0..4 new ones (clock, id, counter)
            at = rng.randrange(2, len(prompt) - 4)
            prompt[at:at + rng.randint(0, 3)] = [rng.randrange(10, 60) for _ in range(rng.randint(0, 4))]
        prompt += [rng.randrange(10, 60) for _ in range(tail)]
        self.n += 1
        seq = request(f"r{self.n}", prompt, max_tokens)
        self.s.add(seq)

    @rule()
    def one_step(self) -> None:
        if self.s.has_work():
            step(self.s)

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = list(self.s.running) + list(self.s.waiting)
        if live:
            seq = data.draw(st.sampled_from(live))
            assert self.s.abort(seq.request_id) is seq and seq.status is Status.FINISHED

    @rule()
    def drain(self) -> None:
        for _ in range(300):
            if not self.s.has_work():
                break
            step(self.s)
        assert not self.s.has_work(), "no progress"
        event(f"span reuse happened: {self.s.stats.span_reused_tokens > 0}")
        event(f"eviction happened: {self.s.stats.evicted_slots > 0}")
        assert self.s.cache is not None and self.s.cache.protected_size == 0

    @invariant()
    def ledger_and_kv(self) -> None:
        if not hasattr(self, "s"):
            return
        conserved(self.s)
        check_tree_kv(self.s)
        for seq in self.s.running:
            check_kv(self.s, seq, seq.num_computed)
            for a, b in seq.filled:  # copied ahead of the computed frontier
                assert seq.num_computed < a < b <= len(seq.slots)
                check_kv_range(self.s, seq, a, b)

TestSpanMachine = SpanMachine.TestCase
TestSpanMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
