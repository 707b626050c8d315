"""Scheduler rules at the step level (issue 21), without a model.

Driven like ``test_scheduler_pool_pressure`` (the forward pass is "every ready request samples
token 7") with the slot ledger checked after every step. What is pinned here, by hand-computed
figures: ``cache_hit_tokens`` counts the cached prompt tokens of each request once, at its first
admission that sticks (an admission undone for lack of room counts nothing; a retracted request
re-admitted counts nothing again); ``prompt_tokens`` / ``prefill_tokens`` / ``decode_tokens``
count what was queued / computed (draft rows are decode rows); the spare budget after decodes
and prefills is what drafts get, charged per draft, and a draft that finds no room is dropped
without evicting or retracting anyone.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.sched.scheduler import LPM_MAX_QUEUE, Scheduler
from prefixgate.local_engine.sched.sequence import Sequence, Status
from prefixgate.local_engine.spec.drafters import Draft
from tests.engine.test_scheduler_pool_pressure import TOKEN, conserved, make, request, run_all, step


def hits_add_up(s: Scheduler, reqs: list[Sequence]) -> None:
    assert s.stats.cache_hit_tokens == sum(r.cached_tokens or 0 for r in reqs)


def test_an_unadmitted_request_keeps_no_hit_statistic() -> None:
    s = make(slots=64, budget=64, chunk=64, running=4)
    shared = list(range(100, 120))
    warm = request("warm", shared, max_tokens=1)
    s.add(warm)
    run_all(s)
    assert s.stats.cache_hit_tokens == 0 and s.cache is not None and s.cache.total_size == 20
    big = request("big", list(range(300, 330)), max_tokens=4)
    s.add(big)
    step(s)                      # big: 30 slots; the tree keeps the warm prompt's 20
    late = request("late", shared + list(range(400, 431)), max_tokens=2)
    s.add(late)
    step(s)                      # late matches 20, but its other 31 tokens do not fit: undone
    assert list(s.waiting) == [late] and late.cached_tokens is None
    assert s.stats.cache_hit_tokens == 0
    run_all(s)
    assert late.cached_tokens == 20 and s.stats.cache_hit_tokens == 20  # counted once, when it ran
    assert s.stats.prompt_tokens == 20 + 30 + 51


def test_a_retracted_request_is_not_counted_again_when_readmitted() -> None:
    s = make(slots=44, running=2)
    first, second = request("first", list(range(500, 520)), 8), request("second", list(range(600, 620)), 8)
    s.add(first)
    s.add(second)
    for _ in range(60):
        if not s.has_work():
            break
        step(s)
        hits_add_up(s, [first, second])
    assert s.stats.retractions >= 1 and second.cached_tokens == 0
    assert s.stats.cache_hit_tokens == 0  # its KV came back from the tree, but it was no prompt hit


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(40, 120), page=st.sampled_from([1, 4]), n=st.integers(2, 6),
       seed=st.integers(0, 1000))
def test_hit_statistic_is_the_sum_of_admitted_requests_hits_after_every_step(
        slots: int, page: int, n: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    s = make(slots=slots, page=page, budget=32, chunk=16, running=3)
    base = list(range(50, 66))
    reqs = [request(f"r{i}", (base if rng.random() < 0.7 else []) + [rng.randrange(100, 900)
                                                                      for _ in range(rng.randint(1, 12))],
                    max_tokens=rng.randint(1, 6)) for i in range(n)]
    for r in reqs:
        s.add(r)
    for _ in range(400):
        if not s.has_work():
            break
        step(s)
        hits_add_up(s, reqs)
    assert not s.has_work()
    assert s.stats.prompt_tokens == sum(r.num_prompt for r in reqs)


def test_prefill_and_decode_tokens_count_rows_computed_drafts_included() -> None:
    s = make(slots=128, budget=64, chunk=6)
    r = request("r", list(range(10, 20)), max_tokens=8)
    s.add(r)
    step(s)
    step(s)                                  # 6 + 4 prompt tokens in chunks of 6
    assert (s.stats.prefill_tokens, s.stats.decode_tokens) == (10, 0)
    batch = s.schedule(lambda decodes, budget: [Draft([TOKEN, TOKEN, 3])])
    assert [(it.is_decode, it.n, it.num_rows) for it in batch] == [(True, 1, 4)]
    assert (s.stats.prefill_tokens, s.stats.decode_tokens) == (10, 4)
    s.complete_step(batch)
    s.accept_draft(r, [TOKEN])
    r.token_ids += [TOKEN, TOKEN]
    assert r.num_computed == 12 and len(r.slots) == 12
    conserved(s)


def test_drafts_get_the_spare_budget_and_each_draft_is_charged() -> None:
    s = make(slots=256, budget=8, chunk=8, running=4)
    a, b = request("a", list(range(10, 15)), 20), request("b", list(range(20, 25)), 20)
    s.add(a)
    s.add(b)
    step(s)  # 5 + 3 of b
    step(s)  # a decodes (1), b's last 2 prompt tokens
    seen: list[int] = []

    def greedy(decodes: list[Sequence], budget: int) -> list[Draft | None]:
        seen.append(budget)
        return [Draft([TOKEN] * 5) for _ in decodes]  # ignores the budget

    batch = s.schedule(greedy)
    # 2 decode rows of 8: 6 spare; a's 5-token draft takes 5, b's is cut to the 1 left
    assert seen == [6]
    assert [(it.seq.request_id, it.num_rows) for it in batch] == [("a", 6), ("b", 2)]
    assert sum(it.num_rows for it in batch) == 8
    assert len(a.slots) == 7 + 5 and len(b.slots) == 6 + 1  # a: 5 prompt + 2 decoded


def test_no_draft_is_asked_for_when_no_budget_is_left() -> None:
    s = make(slots=256, budget=2, chunk=2, running=4)
    reqs = [request(f"r{i}", [10 + i, 20 + i], 6) for i in range(2)]
    for r in reqs:
        s.add(r)
    step(s)   # r0's prompt (2 of budget 2)
    step(s)   # r0 decodes, r1 gets 1 token
    called: list[int] = []
    batch = s.schedule(lambda decodes, budget: called.append(budget) or [Draft([TOKEN])] * len(decodes))
    assert called == [] and all(it.draft is None for it in batch)
    assert sum(it.num_rows for it in batch) == 2


def test_decodes_beyond_the_budget_wait_for_the_next_step() -> None:
    s = make(slots=256, budget=3, chunk=1, running=4)
    reqs = [request(f"q{i}", [10 + i], 5) for i in range(3)]
    for r in reqs:
        s.add(r)
    step(s)                               # three 1-token prompts, one token each
    s.budget = 2                          # max_num_batched_tokens below the decoding requests
    batch = s.schedule()
    assert [(it.seq.request_id, it.is_decode) for it in batch] == [("q0", True), ("q1", True)]
    assert len(reqs[2].slots) == 1 and s.stats.decode_tokens == 2


def test_a_draft_without_room_is_dropped_and_nobody_is_evicted_or_retracted() -> None:
    s = make(slots=12, budget=64, chunk=64, running=2)
    a = request("a", list(range(10, 20)), 4)
    s.add(a)
    step(s)              # 10 slots for the prompt; 2 left
    batch = s.schedule(lambda decodes, budget: [Draft([TOKEN] * 4)])  # needs 1 + 4 > 2
    assert [(it.n, it.draft) for it in batch] == [(1, None)]
    assert s.stats.retractions == 0 and s.running == [a] and len(a.slots) == 11
    assert s.stats.decode_tokens == 1


def test_a_draft_is_kept_when_exactly_enough_room_is_left() -> None:
    s = make(slots=12, budget=64, chunk=64, running=2)
    a = request("a", list(range(10, 20)), 4)
    s.add(a)
    step(s)
    batch = s.schedule(lambda decodes, budget: [Draft([TOKEN])])  # 1 + 1 = the 2 slots left
    assert batch[0].draft is not None and batch[0].draft.tokens == [TOKEN] and len(a.slots) == 12


def test_admission_stops_at_max_running_and_keeps_arrival_order_without_hits() -> None:
    s = make(slots=256, budget=64, chunk=64, running=2)
    reqs = [request(f"r{i}", [10 * i + j for j in range(1, 5)], 2) for i in range(1, 5)]
    for r in reqs:
        s.add(r)
    step(s)
    assert [x.request_id for x in s.running] == ["r1", "r2"]
    assert [x.request_id for x in s.waiting] == ["r3", "r4"]


def test_longest_cached_prefix_goes_first_only_for_a_sortable_queue() -> None:
    shared = list(range(100, 140))

    def warmed(extra: int) -> tuple[Scheduler, Sequence]:
        s = make(slots=2048, budget=512, chunk=512, running=1)
        s.add(request("warm", shared + [1], max_tokens=1))
        run_all(s)
        cold = [request(f"c{i}", [900 + i, 901 + i, 902 + i], 3) for i in range(extra)]
        hot = request("hot", shared + [2, 3], 3)
        for r in cold + [hot]:
            s.add(r)
        return s, hot

    s, hot = warmed(1)
    step(s)
    assert s.running == [hot] and hot.cached_tokens == 40
    s, hot = warmed(LPM_MAX_QUEUE)       # 129 waiting: sorting skipped, arrival order
    step(s)
    assert [r.request_id for r in s.running] == ["c0"]


def test_a_shared_uncached_prefix_defers_only_the_same_cache_namespace() -> None:
    shared = list(range(500, 540))
    for key, deferred in ((None, True), (b"other", False)):
        s = make(slots=512, budget=512, chunk=16, running=4)
        a = request("a", shared + [1, 2], 3)
        b = request("b", shared + [3, 4], 3)
        b.extra_key = key
        s.add(a)
        s.add(b)
        step(s)
        assert (b.status is Status.WAITING) is deferred
        run_all(s)
        assert b.cached_tokens == (40 if deferred else 0)


def test_a_shared_prefix_below_the_threshold_is_computed_twice() -> None:
    s = make(slots=512, budget=512, chunk=512, running=4)
    a, b = request("a", list(range(500, 531)) + [1], 2), request("b", list(range(500, 531)) + [2], 2)
    s.add(a)
    s.add(b)
    step(s)  # 31 shared tokens < 32: both run at once
    assert s.running == [a, b]
    s = make(slots=512, budget=512, chunk=16, running=4)
    a, b = request("a", list(range(500, 532)) + [1], 2), request("b", list(range(500, 532)) + [2], 2)
    s.add(a)
    s.add(b)
    step(s)  # 32: b waits for a's prompt
    assert s.running == [a]


def test_abort_finds_waiting_and_running_requests() -> None:
    s = make(slots=256, running=1)
    a, b = request("a", [1, 2, 3], 4), request("b", [4, 5, 6], 4)
    s.add(a)
    s.add(b)
    step(s)
    assert s.abort("b") is b and b.status is Status.FINISHED and b.finish_reason == "abort"
    assert list(s.waiting) == [] and s.abort("nobody") is None
    assert s.abort("a") is a and s.running == [] and not s.has_work()
    conserved(s)


def test_without_a_prefix_cache_requests_run_in_arrival_order_and_none_waits() -> None:
    s = make(slots=512, budget=512, chunk=64, running=4, cache=False)
    shared = list(range(500, 540))
    reqs = [request("a", shared + [1], 2), request("b", shared + [2], 2), request("c", [9, 8, 7], 2)]
    for r in reqs:
        s.add(r)
    step(s)
    assert s.running == reqs and s.stats.cache_hit_tokens == 0
    run_all(s)
    assert s.stats.prefill_tokens == 41 + 41 + 3


def test_the_newest_of_three_is_retracted_first() -> None:
    s = make(slots=70, running=3)
    reqs = [request(f"r{i}", list(range(100 * i + 100, 100 * i + 120)), 8) for i in range(3)]
    for r in reqs:
        s.add(r)
    step(s)
    assert s.running == reqs
    for _ in range(40):
        if s.stats.retractions:
            break
        step(s)
    assert s.stats.retractions == 1 and s.running == reqs[:2] and list(s.waiting) == [reqs[2]]
    assert reqs[2].status is Status.WAITING and reqs[2].prompt_cached is False
    run_all(s)
    assert all(r.num_completion == 8 for r in reqs)


def test_longest_prefix_sorting_covers_a_full_queue_and_reads_the_whole_cacheable_prompt() -> None:
    shared = list(range(100, 140))

    def warmed(extra: int, key: bytes | None = None) -> tuple[Scheduler, Sequence, Sequence]:
        s = make(slots=4096, budget=512, chunk=512, running=1)
        w = request("warm", shared + [1], max_tokens=1)
        w.extra_key = key
        s.add(w)
        run_all(s)
        cold = [request(f"c{i}", [900 + i, 901 + i, 902 + i], 3) for i in range(extra)]
        near = request("near", shared + [7, 8, 9], 3)   # 40 cached of its 42 cacheable
        full = request("full", shared + [1, 9], 3)      # all 41 cacheable tokens cached
        for r in cold + [near, full]:
            r.extra_key = key
            s.add(r)
        return s, near, full

    s, near, full = warmed(LPM_MAX_QUEUE - 2)   # 128 waiting: still sorted
    step(s)
    assert s.running == [full] and full.cached_tokens == 41
    s, near, full = warmed(0, key=b"tenant")     # hits are looked up in the request's namespace
    step(s)
    assert s.running == [full]


def test_a_deferred_request_does_not_hold_back_the_rest_of_the_queue() -> None:
    shared = list(range(500, 540))
    s = make(slots=1024, budget=512, chunk=16, running=4)
    x = request("x", list(range(700, 740)), 3)
    x.extra_key = b"other"                        # prefilling too, but another namespace
    a, b = request("a", shared + [1, 2], 3), request("b", shared + [3, 4], 3)
    c = request("c", [9, 8, 7], 3)
    for r in (x, a, b, c):
        s.add(r)
    step(s)
    assert s.running == [x, a, c] and list(s.waiting) == [b]


def test_only_the_uncached_part_of_a_shared_prefix_defers() -> None:
    cached = list(range(100, 140))
    for key in (None, b"k"):
        s = make(slots=1024, budget=512, chunk=16, running=4)
        w = request("warm", cached + [1], max_tokens=1)
        w.extra_key = key
        s.add(w)
        run_all(s)
        tail = [600, 601, 602, 603, 604]
        a, b = request("a", cached + tail + [1, 2], 3), request("b", cached + tail + [3, 4], 3)
        for r in (a, b):
            r.extra_key = key
            s.add(r)
        step(s)  # 45 shared, 40 of them cached: 5 uncached < 32, both run
        assert s.running == [a, b] and a.cached_tokens == b.cached_tokens == 40


def test_a_prefill_is_cut_by_the_chunk_and_by_what_the_step_has_left() -> None:
    s = make(slots=512, budget=10, chunk=6, running=4)
    a, b = request("a", list(range(10, 25)), 2), request("b", list(range(30, 42)), 2)
    s.add(a)
    s.add(b)
    sizes = []
    for _ in range(3):
        batch = s.schedule()
        sizes.append([(it.seq.request_id, it.n) for it in batch])
        s.complete_step(batch)
        conserved(s)
    # step 1: a 6 (chunk), b 4 (budget); step 2: a 6, b 4; step 3: a 3 (its rest), b 4 (its rest)
    assert sizes == [[("a", 6), ("b", 4)], [("a", 6), ("b", 4)], [("a", 3), ("b", 4)]]


def test_one_spare_row_is_enough_for_a_one_token_draft_and_an_empty_budget_drops_the_rest() -> None:
    s = make(slots=256, budget=3, chunk=8, running=4)
    a, b = request("a", [10, 11], 20), request("b", [20], 20)
    s.add(a)
    s.add(b)
    step(s)   # both prompts (3 rows)
    budgets: list[int] = []

    def propose(decodes: list[Sequence], budget: int) -> list[Draft | None]:
        budgets.append(budget)
        return [Draft([TOKEN]) for _ in decodes]

    batch = s.schedule(propose)  # 2 decode rows of 3: one spare row, a's draft takes it
    assert budgets == [1]
    assert [(it.seq.request_id, None if it.draft is None else it.draft.tokens) for it in batch] \
        == [("a", [TOKEN]), ("b", None)]


def test_a_request_whose_cacheable_prompt_is_all_cached_starts_as_a_decode() -> None:
    s = make(slots=256, budget=64, chunk=64, running=4)
    w = request("w", list(range(10, 20)), max_tokens=3)
    s.add(w)
    run_all(s)                  # the tree holds its 10 prompt + 2 computed completion tokens
    again = request("again", list(w.token_ids), 2)  # 13 tokens: all but the last are cached
    s.add(again)
    before = (s.stats.prefill_tokens, s.stats.decode_tokens)
    batch = s.schedule()
    assert [(it.n, it.is_decode) for it in batch] == [(1, True)] and again.cached_tokens == 12
    assert (s.stats.prefill_tokens, s.stats.decode_tokens) == (before[0], before[1] + 1)


def test_admission_stops_when_the_budget_is_spent_exactly() -> None:
    s = make(slots=256, budget=4, chunk=8, running=4)
    a, b = request("a", [1, 2, 3, 4], 3), request("b", [5, 6], 3)
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert [(it.seq.request_id, it.n) for it in batch] == [("a", 4)] and list(s.waiting) == [b]
    assert b.status is Status.WAITING and b.slots == []


def test_every_table_row_can_be_used() -> None:
    s = make(slots=256, budget=64, chunk=8, running=8)  # the table has 8 rows
    reqs = [request(f"r{i}", [10 + i, 20 + i], 2) for i in range(9)]
    for r in reqs:
        s.add(r)
    step(s)
    assert s.running == reqs[:8] and list(s.waiting) == [reqs[8]]


def test_a_prefill_that_cannot_fit_even_alone_schedules_nothing() -> None:
    s = make(slots=20, budget=64, chunk=16, running=2)
    r = request("r", list(range(100, 130)), 2)   # 30 prompt tokens in a 20-slot pool
    s.add(r)
    assert [it.n for it in s.schedule()] == [16]
    assert s.schedule() == [] and s.running == [r]


def test_room_for_a_prefill_is_made_by_retracting_only_as_many_as_needed() -> None:
    s = make(slots=56, budget=64, chunk=16, running=3)
    reqs = [request(f"r{i}", list(range(100 * i + 100, 100 * i + 148)), 2) for i in range(3)]
    for r in reqs:
        s.add(r)
    step(s)          # 16 of each 48-token prompt: 48 of 56 slots, nobody decodes yet
    batch = s.schedule()
    # r0's next chunk needs 16 of the 8 free: the newest (r2) goes back, its 16 slots are enough
    assert [(it.seq.request_id, it.n) for it in batch] == [("r0", 16)]
    assert s.stats.retractions == 1 and s.running == reqs[:2] and list(s.waiting) == [reqs[2]]
    s.complete_step(batch)
    conserved(s)
    run_all(s)


def test_the_prompt_enters_the_tree_when_its_prefill_ends_and_the_rest_at_finish() -> None:
    s = make(slots=256, budget=64, chunk=8, running=2)
    r = request("r", list(range(10, 22)), max_tokens=5)   # 12 prompt tokens: chunks of 8 + 4
    s.add(r)
    assert s.cache is not None
    step(s)
    assert s.cache.total_size == 0 and not r.prompt_cached   # 8 of 12 computed
    step(s)
    assert s.cache.total_size == 12 and r.prompt_cached       # the prompt, as soon as computed
    for _ in range(3):
        step(s)
        assert s.cache.total_size == 12                        # decoding adds nothing yet
    step(s)
    assert r.status is Status.FINISHED and s.cache.total_size == 12 + 4  # the computed completion


def test_one_cached_token_and_one_to_compute_is_a_decode() -> None:
    s = make(slots=256, budget=64, chunk=64, running=4)
    s.add(request("w", [5], max_tokens=1))
    run_all(s)
    again = request("again", [5, 7], 2)
    s.add(again)
    batch = s.schedule()
    assert [(it.start, it.n, it.is_decode) for it in batch] == [(1, 1, True)]


def test_each_retraction_is_counted_and_goes_to_the_front_of_the_queue() -> None:
    s = make(slots=256, budget=64, chunk=64, running=4)
    a, b, c = (request(x, [ord(x), ord(x) + 1, ord(x) + 2], 4) for x in "abc")
    for r in (a, b, c):
        s.add(r)
    step(s)
    s.retract(b)
    s.retract(a)
    assert s.stats.retractions == 2 and list(s.waiting) == [a, b] and s.running == [c]
    assert a.status is Status.WAITING and b.status is Status.WAITING and not a.prompt_cached
    conserved(s)


def test_the_last_row_of_the_budget_goes_to_a_running_prefill() -> None:
    s = make(slots=256, budget=2, chunk=8, running=4)
    a, b = request("a", [1], 4), request("b", list(range(10, 20)), 2)
    s.add(a)
    s.add(b)
    step(s)   # a's 1-token prompt, b's first token
    batch = s.schedule()
    assert [(it.seq.request_id, it.n, it.is_decode) for it in batch] == [("b", 1, False), ("a", 1, True)]
