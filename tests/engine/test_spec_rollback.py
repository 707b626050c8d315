"""Rollback of rejected draft tokens (hypothesis): the slot ledger holds after every step, and the
radix tree never holds a token that was rejected.

Like ``test_scheduler_pool_pressure`` the model is replaced: a proposer drafts ``a`` tokens
``ACCEPTED`` followed by tokens ``REJECTED``, verification accepts exactly the ``ACCEPTED`` prefix
and samples ``TOKEN``. Pools are small, so drafts compete with eviction and retraction.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.sched.scheduler import Scheduler
from prefixgate.local_engine.sched.sequence import Sequence
from prefixgate.local_engine.spec.drafters import Draft
from tests.engine.test_scheduler_pool_pressure import TOKEN, _tree_slots, conserved, make, request

ACCEPTED, REJECTED = 8, 999


def tree_tokens(s: Scheduler) -> set[int]:
    out: set[int] = set()
    assert s.cache is not None
    for root in s.cache._roots.values():
        stack = list(root.children.values())
        while stack:
            n = stack.pop()
            out.update(n.key)
            stack.extend(n.children.values())
    return out


def run(s: Scheduler, rng: random.Random, k_max: int, limit: int = 600) -> int:
    """Run to completion with random drafts; returns the number of rejected draft tokens."""
    rejected = 0

    def propose(decodes: list[Sequence], budget: int) -> list[Draft | None]:
        out: list[Draft | None] = []
        for _ in decodes:
            k = rng.randint(0, k_max)
            a = rng.randint(0, k)
            out.append(Draft([ACCEPTED] * a + [REJECTED] * (k - a)) if k else None)
        return out

    for _ in range(limit):
        if not s.has_work():
            return rejected
        batch = s.schedule(propose)
        ready = set(map(id, s.complete_step(batch)))
        for item in batch:
            seq = item.seq
            if id(seq) not in ready:
                continue
            accepted: list[int] = []
            if item.draft is not None:
                for t in item.draft.tokens:
                    if t != ACCEPTED:
                        break
                    accepted.append(t)
                rejected += len(item.draft.tokens) - len(accepted)
                s.accept_draft(seq, accepted)
                assert len(seq.slots) == seq.num_computed  # nothing past the kept tokens
            for tok in accepted + [TOKEN]:
                seq.token_ids.append(tok)
                if seq.num_completion >= seq.max_tokens:
                    s.finish(seq)
                    break
        conserved(s)
        assert REJECTED not in tree_tokens(s)
    raise AssertionError("no progress")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.sampled_from([1, 2, 4]), slots=st.integers(48, 160), k_max=st.integers(1, 6),
       n_req=st.integers(1, 4), seed=st.integers(0, 10_000), shared=st.booleans())
def test_rollback_keeps_the_ledger_and_the_tree_clean(page: int, slots: int, k_max: int,
                                                      n_req: int, seed: int,
                                                      shared: bool) -> None:
    rng = random.Random(seed)
    s = make(slots=slots, page=page, budget=48, chunk=16, running=3)
    base = [rng.randrange(10, 500) for _ in range(12)]
    reqs = []
    for i in range(n_req):
        prompt = (base if shared else [rng.randrange(10, 500) for _ in range(12)]) + [
            rng.randrange(10, 500) for _ in range(rng.randint(1, 8))]
        reqs.append(request(f"r{i}", prompt, max_tokens=rng.randint(1, 14)))
        s.add(reqs[-1])
    run(s, rng, k_max)
    for r in reqs:
        assert r.num_completion == r.max_tokens and REJECTED not in r.token_ids
    # everything went back: free pages + tree pages cover the pool
    assert s.pool.free_slots + len(_tree_slots(s.cache)) == s.pool.num_slots  # type: ignore[arg-type]


def test_rollback_frees_whole_pages_only_past_the_kept_tail() -> None:
    s = make(slots=64, page=4, budget=64, chunk=64, running=2)
    r = request("r", list(range(100, 110)), max_tokens=8)
    s.add(r)
    s.complete_step(s.schedule())
    r.token_ids.append(TOKEN)
    free_before = s.pool.free_slots
    batch = s.schedule(lambda decodes, budget: [Draft([ACCEPTED] + [REJECTED] * 5)])
    assert batch[0].draft is not None and len(r.slots) == 11 + 6
    assert s.pool.free_slots == free_before - 8  # 17 tokens need 5 pages, 3 were held
    s.complete_step(batch)
    s.accept_draft(r, [ACCEPTED])
    assert len(r.slots) == r.num_computed == 12
    # 12 kept tokens fill exactly the 3 pages held before; the 2 grown for the drafts are back
    assert s.pool.free_slots == free_before
    conserved(s)
