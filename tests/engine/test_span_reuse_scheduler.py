"""Span reuse in the scheduler, step by step without a model (``span_fake``): what is copied,
what is prefilled, chunking across the copied ranges, the source's lock, aborts, and off."""

from __future__ import annotations

import torch

from prefixgate.local_engine.kv.span_match import SpanBounds
from prefixgate.local_engine.sched.scheduler import Scheduler
from tests.engine.span_fake import check_kv, check_tree_kv, make, request, step
from tests.engine.test_scheduler_pool_pressure import conserved

BASE = list(range(100, 160))
BOUNDS = SpanBounds(max_spans=2, max_span_tokens=6, min_anchor_tokens=4)


def run_all(s: Scheduler) -> list[tuple[str, int, int]]:
    """Steps until idle, checking the ledger; returns every scheduled (request, start, n)."""
    log = []
    for _ in range(400):
        if not s.has_work():
            return log
        batch, _ = step(s)
        log += [(it.seq.request_id, it.start, it.n) for it in batch]
        conserved(s)
    raise AssertionError("no progress")


def old_branch(s: Scheduler) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    assert s.cache is not None
    m = s.cache.match_prefix(BASE)
    idx = torch.tensor(m.slots)
    return m.slots, s.pool.k[0][idx].clone(), s.pool.v[0][idx].clone()


def test_a_changed_span_of_new_length_prefills_only_the_span_and_the_tail_in_chunks() -> None:
    s = make(slots=400, chunk=4, bounds=BOUNDS)
    s.add(request("a", BASE + [1], max_tokens=1))
    run_all(s)
    before = old_branch(s)
    new = BASE[:10] + [50, 51, 52] + BASE[12:] + [2, 3, 4, 5, 6]  # 2 tokens became 3: shift +1
    b = request("b", new, max_tokens=2)
    s.add(b)
    log = [x for x in run_all(s) if x[0] == "b"]
    # prefill: the span [10, 13) then, after the copied run [13, 61), the tail [61, 66) by 4s
    assert log[:3] == [("b", 10, 3), ("b", 61, 4), ("b", 65, 1)]
    assert b.cached_tokens == 10 + 48 + 0 and b.span_reused_tokens == 48
    assert s.stats.span_reused_tokens == 48
    after = old_branch(s)
    assert after[0] == before[0] and torch.equal(after[1], before[1]) and torch.equal(after[2], before[2])
    check_tree_kv(s)  # b's branch, copied keys re-rotated to their new positions
    assert s.cache is not None and s.cache.match_prefix(new[:-1]).handle.cached_len == len(new) - 1


def test_the_copied_kv_is_what_the_request_would_have_computed_at_the_new_positions() -> None:
    s = make(slots=400, chunk=64, bounds=BOUNDS)
    s.add(request("a", BASE + [1], max_tokens=1))
    run_all(s)
    b = request("b", BASE[:5] + [50] + BASE[8:] + [9, 9], max_tokens=3)  # 3 tokens became 1
    s.add(b)
    batch, _ = step(s)
    # one computed token (the span), then the copied run [6, 58) counts as computed
    assert [(it.start, it.n) for it in batch] == [(5, 1)] and b.num_computed == 58
    check_kv(s, b, 58)  # the run's keys re-rotated by -2: equal to fresh keys at 6..57
    run_all(s)


def test_the_source_branch_is_locked_while_the_copy_makes_room() -> None:
    # 48 slots: a's 40-token branch fills the tree; b's copy needs room only evicting that
    # branch would give, and it is the copy's source: no reuse, b runs as a prefix match
    s = make(slots=48, chunk=64, bounds=BOUNDS)
    a = BASE[:40]
    s.add(request("a", a, max_tokens=1))
    run_all(s)
    b = request("b", a[:5] + [50] + a[6:] + [2, 2], max_tokens=2)
    s.add(b)
    run_all(s)
    assert b.span_reused_tokens == 0 and b.cached_tokens == 5 and b.num_completion == 2


def test_abort_mid_prefill_of_a_span_reused_request_returns_every_slot() -> None:
    s = make(slots=400, chunk=2, bounds=BOUNDS)
    s.add(request("a", BASE + [1], max_tokens=1))
    run_all(s)
    free_before = s.pool.free_slots
    b = request("b", [7, 7, 7] + BASE[3:] + list(range(10, 30)), max_tokens=2)
    s.add(b)
    step(s)
    step(s)
    assert b.span_reused_tokens > 0 and b.filled == [] and b.num_computed < b.num_prompt
    assert s.abort("b") is b
    conserved(s)
    assert s.cache is not None and s.cache.protected_size == 0
    assert s.pool.free_slots + s.cache.total_size == s.pool.num_slots
    assert s.pool.free_slots <= free_before  # b's computed part may stay in the tree


def test_span_reuse_off_schedules_exactly_the_prefix_match() -> None:
    runs = []
    for bounds in (None, BOUNDS):
        s = make(slots=400, chunk=8, bounds=bounds)
        s.add(request("a", BASE + [1], max_tokens=1))
        run_all(s)
        b = request("b", BASE[:10] + [50] + BASE[11:] + [2], max_tokens=2)
        s.add(b)
        runs.append((run_all(s), b.cached_tokens, b.span_reused_tokens, s.pool.free_slots))
    off, on = runs
    assert off[1:] == (10, 0, 400 - 61 - 52) and off[0][0] == ("b", 10, 8)  # prefill from 10 on
    assert on[1:] == (10 + 49, 49, off[3]) and on[0][0] == ("b", 10, 1)  # same slot usage


def test_a_span_reused_request_publishes_block_stored_for_its_new_blocks() -> None:
    from prefixgate.local_engine.kv.block_hash import block_digests, wire_hash
    from prefixgate.local_engine.kv.events import KVEventRecorder
    from tests.kv_events.test_recorder import _tree_blocks

    s = make(slots=400, chunk=8, bounds=BOUNDS)
    rec = KVEventRecorder(block_size=4)
    s.kv.on_insert.append(rec.on_insert)
    assert s.cache is not None
    s.cache.on_evict, s.cache.on_reset = rec.evicted, rec.cleared
    s.add(request("a", BASE + [1], max_tokens=1))
    run_all(s)
    rec.take()
    new = BASE[:8] + [50, 51] + BASE[9:] + [2, 3, 4, 5]  # shift +1 after position 8
    b = request("b", new, max_tokens=1)
    s.add(b)
    run_all(s)
    assert b.span_reused_tokens > 0
    stored = [e for e in rec.take() if e[0] == "BlockStored"]
    got = [h for e in stored for h in e[1]]
    want = [wire_hash(d) for d in block_digests(new[:64], 4, "sha256", "", None)][2:]
    assert got == want  # every block from the divergence on is new: new hashes, parents chained
    assert stored[0][2] == wire_hash(block_digests(new, 4, "sha256", "", None)[1])
    assert set(rec.held) == _tree_blocks(s.cache, rec)


def test_pd_export_of_a_span_reused_prompt_sends_its_own_kv_at_its_positions() -> None:
    from prefixgate.local_engine.pd.kv_io import export_prefix, gather_kv, kv_view, release
    from tests.engine.span_fake import kv_of

    s = make(slots=400, chunk=16, bounds=BOUNDS)
    s.add(request("a", BASE + [1], max_tokens=1))
    run_all(s)
    new = BASE[:12] + [50] + BASE[15:] + [2, 3]  # shift -2
    s.add(request("b", new, max_tokens=1))
    run_all(s)
    assert s.cache is not None
    ex = export_prefix(s.cache, new, None, start=12)
    assert ex is not None and ex.tokens == new and ex.num_transfer == len(new) - 12
    view = kv_view(torch.empty(2 * ex.num_transfer * 2), 1, ex.num_transfer, 1, 2)
    gather_kv(s.pool, ex.slots, view)  # [layers, K/V, tokens, heads, dim]
    for i, pos in enumerate(range(12, len(new))):
        k, v = kv_of(new[pos], pos)
        assert torch.allclose(view[0, 0, i, 0], torch.tensor(k), atol=1e-4)
        assert torch.allclose(view[0, 1, i, 0], torch.tensor(v))
    release(s.cache, ex.handle)
    s.cache.check()
    assert s.cache.protected_size == 0


def test_no_reuse_across_extra_key_namespaces() -> None:
    s = make(slots=400, chunk=64, bounds=BOUNDS)
    a = request("a", BASE + [1], max_tokens=1)
    a.extra_key = b"images-1"
    s.add(a)
    run_all(s)
    b = request("b", [50] + BASE[1:] + [2], max_tokens=1)
    b.extra_key = b"images-2"  # same tokens after the span, other pixels: nothing shared
    s.add(b)
    run_all(s)
    assert b.span_reused_tokens == 0 and b.cached_tokens == 0


def test_a_match_that_runs_into_another_sessions_branch_still_finds_its_own_turn() -> None:
    # session A's prompt shares one more token with the new request than B's previous turn
    # does (a clock digit they happen to share): the longest match ends inside A's branch,
    # below which nothing re-aligns; B's own branch hangs one node up
    s = make(slots=600, chunk=64, bounds=BOUNDS)
    x, ha, hb = BASE[:20], list(range(300, 340)), list(range(400, 440))
    s.add(request("a", x + [5, 6, 7] + ha + [1], max_tokens=1))
    run_all(s)
    s.add(request("b1", x + [5, 8] + hb + [1], max_tokens=1))
    run_all(s)
    b2 = request("b2", x + [5, 6] + hb + [2, 3], max_tokens=2)
    s.add(b2)
    run_all(s)
    assert b2.cached_tokens == 22 + len(hb) and b2.span_reused_tokens == len(hb)
    check_tree_kv(s)
