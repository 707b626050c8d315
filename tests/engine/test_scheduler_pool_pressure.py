"""Scheduler + KV pool + radix tree under memory pressure, driven step by step without a model.

The forward pass is replaced by "every ready request samples token 7", so each test is a pure,
deterministic replay of the scheduler's bookkeeping. After EVERY step :func:`conserved` checks the
slot ledger: each pool slot is in exactly one place — the free list, the radix tree, or the owned
tail of one running request — and every running request's slots ``[:num_tree_tokens]`` are tree
slots it holds locked (so eviction cannot hand them to another request while it runs).
"""

from __future__ import annotations

import pytest
import torch

from prefixgate.local_engine.kv.pool import KVPool, PoolExhausted, ReqToTokenTable
from prefixgate.local_engine.kv.radix_cache import RadixCache, TreeNode
from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.scheduler import Scheduler
from prefixgate.local_engine.sched.sequence import Sequence, Status

CPU = torch.device("cpu")
TOKEN = 7


def make(slots: int, page: int = 1, budget: int = 64, chunk: int = 64, running: int = 4,
         cache: bool = True) -> Scheduler:
    pool = KVPool(1, slots, 1, 2, torch.float32, CPU, page)
    return Scheduler(pool, ReqToTokenTable(8, 512, CPU), RadixCache(page) if cache else None,
                     budget, chunk, running)


def request(rid: str, prompt: list[int], max_tokens: int = 4) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Sequence(rid, prompt, params, max_tokens, None, torch.Generator(), None,  # type: ignore[arg-type]
                    set(), lambda out: None)


def _tree_slots(cache: RadixCache) -> dict[int, TreeNode]:
    out: dict[int, TreeNode] = {}
    for root in cache._roots.values():
        stack = list(root.children.values())
        while stack:
            n = stack.pop()
            out.update((s, n) for s in n.value)
            stack.extend(n.children.values())
    return out


def conserved(s: Scheduler) -> None:
    """The slot ledger (module docstring), by page; raises AssertionError naming the broken rule.

    A running request owns whole pages: with ``page_size > 1`` the tail of its last page is
    reserved for its next tokens, so the ledger counts the pages of its slots.
    """
    ps = s.pool.page_size
    free = list(s.pool._free)
    assert len(free) == len(set(free)), "a page is twice in the free list"
    tree: dict[int, TreeNode] = {}
    if s.cache is not None:
        s.cache.check()
        tree = _tree_slots(s.cache)
    tree_pages = sorted({slot // ps for slot in tree})
    assert len(tree) == len(tree_pages) * ps, "the tree holds part of a page"
    owned: list[int] = []
    for seq in s.running:
        assert seq.status is Status.RUNNING and seq.row is not None
        for slot in seq.slots[: seq.num_tree_tokens]:
            assert slot in tree and tree[slot].ref_count > 0, "a running request's prefix unlocked"
        owned += sorted({slot // ps for slot in seq.slots[seq.num_tree_tokens:]})
    for seq in s.waiting:
        assert seq.slots == [] and seq.handle is None and seq.row is None
    everything = free + tree_pages + owned
    assert len(everything) == len(set(everything)), "a page is in two places"
    assert sorted(everything) == list(range(s.pool.num_pages)), "a page leaked"


def step(s: Scheduler) -> list[Sequence]:
    """One step: schedule, 'compute', sample TOKEN for ready requests, finish at max_tokens."""
    batch = s.schedule()
    done = []
    for seq in s.complete_step(batch):
        seq.token_ids.append(TOKEN)
        if seq.num_completion >= seq.max_tokens:
            s.finish(seq)
            done.append(seq)
    conserved(s)
    return done


def run_all(s: Scheduler, limit: int = 400) -> None:
    for _ in range(limit):
        if not s.has_work():
            return
        step(s)
    raise AssertionError("scheduler made no progress")


def test_admission_waits_when_the_pool_cannot_hold_the_first_chunk() -> None:
    s = make(slots=24, running=4)
    a, b = request("a", list(range(100, 120)), max_tokens=3), request("b", list(range(200, 220)))
    s.add(a)
    s.add(b)
    step(s)
    assert s.running == [a] and list(s.waiting) == [b]  # b's 20 tokens do not fit beside a's
    assert b.cached_tokens is None and b.slots == []    # unadmitted cleanly: no stats, no slots
    run_all(s)
    assert a.num_completion == 3 and b.num_completion == 4


def test_decode_under_pressure_evicts_unlocked_tree_leaves_before_retracting() -> None:
    s = make(slots=40, running=2)
    s.add(request("old", list(range(300, 320)), max_tokens=1))
    run_all(s)
    assert s.cache is not None and s.cache.evictable_size == 20  # old's KV kept in the tree
    live = request("live", list(range(400, 418)), max_tokens=6)
    s.add(live)
    run_all(s)
    assert s.stats.retractions == 0 and s.stats.evicted_slots > 0
    assert live.num_completion == 6


def test_decode_under_pressure_retracts_the_newest_and_it_resumes_from_the_tree() -> None:
    s = make(slots=44, running=2)
    first, second = request("first", list(range(500, 520)), 8), request("second", list(range(600, 620)), 8)
    s.add(first)
    s.add(second)
    step(s)
    assert s.running == [first, second]
    for _ in range(40):
        if s.stats.retractions:
            break
        step(s)
    assert s.running == [first] and s.waiting[0] is second  # the newest went back, to the front
    assert second.status is Status.WAITING and second.num_completion > 0
    kept = list(second.token_ids)
    run_all(s)
    assert second.token_ids[: len(kept)] == kept and second.num_completion == 8
    assert first.num_completion == 8


def test_a_running_requests_locked_prefix_survives_eviction_for_a_newcomer() -> None:
    s = make(slots=64, running=2)
    shared = list(range(700, 724))
    s.add(request("warm", shared + [1], max_tokens=1))
    run_all(s)
    runner = request("runner", shared + [2, 3], max_tokens=10)
    s.add(runner)
    step(s)
    assert runner.cached_tokens == 24 and runner.num_tree_tokens >= 24
    locked = list(runner.slots[:24])
    s.add(request("big", list(range(800, 830)), max_tokens=2))  # needs the tree's free leaves
    for _ in range(3):
        step(s)
    assert runner.slots[:24] == locked  # still the tree's slots, never handed out again
    run_all(s)


@pytest.mark.parametrize("page", [1, 4])
def test_many_requests_sharing_prefixes_in_a_small_pool_all_finish_with_no_leak(page: int) -> None:
    s = make(slots=96, page=page, budget=48, chunk=16, running=3)
    base = [list(range(900, 916)), list(range(950, 966))]
    reqs = [request(f"r{i}", base[i % 2] + [i, i + 1, i + 2][: 1 + i % 3], max_tokens=2 + i % 5)
            for i in range(12)]
    for r in reqs:
        s.add(r)
    run_all(s)
    assert all(r.status is Status.FINISHED and r.num_completion == r.max_tokens for r in reqs)
    assert s.cache is not None and s.cache.protected_size == 0
    assert s.pool.free_slots + s.cache.total_size == s.pool.num_slots
    assert s.stats.cache_hit_tokens > 0


def test_abort_of_a_running_request_returns_every_slot() -> None:
    s = make(slots=64, cache=True)
    r = request("r", list(range(1000, 1030)), max_tokens=20)
    s.add(r)
    step(s)
    step(s)
    assert s.abort("r") is r and r.finish_reason == "abort" and r.status is Status.FINISHED
    conserved(s)
    assert s.cache is not None and s.cache.protected_size == 0


def test_pool_alloc_and_free_round_trip_pages_exactly() -> None:
    pool = KVPool(1, 10, 1, 2, torch.float32, CPU, page_size=3)  # 3 pages of 3; 1 slot dropped
    assert pool.num_slots == 9 and pool.free_slots == 9
    pages = pool.alloc_pages(2)
    assert pages == [0, 1] and pool.page_slots(pages) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(PoolExhausted):
        pool.alloc_pages(2)
    assert pool.free_slots == 3  # a failed alloc takes nothing
    pool.free(pool.page_slots(pages))
    assert pool.free_slots == 9 and sorted(pool.alloc_pages(3)) == [0, 1, 2]
    assert pool.alloc_pages(0) == [] and pool.used_slots == 9




def test_twin_requests_computed_side_by_side_free_their_duplicate_kv() -> None:
    # 20 shared tokens are below the in-batch deferral threshold, so both compute the same
    # prompt and completion; the second to reach the tree must free its duplicate slots
    s = make(slots=128, running=2)
    twins = [request(f"t{i}", list(range(40, 60)), max_tokens=3) for i in range(2)]
    for t in twins:
        s.add(t)
    step(s)
    assert s.running == twins and all(t.cached_tokens == 0 for t in twins)
    run_all(s)
    assert s.cache is not None and s.pool.free_slots + s.cache.total_size == s.pool.num_slots
    assert s.cache.total_size == 22  # one copy: 20 prompt + 2 computed completion tokens
