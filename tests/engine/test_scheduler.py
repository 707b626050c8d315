"""Scheduler policy: LPM admission order, in-batch prefix deferral, chunk budget, retraction."""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sequence import Sequence

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def seq(eng: Any, prompt: list[int], rid: str) -> Sequence:
    return eng._make_seq(prompt, PARAMS, None, rid, lambda out: None)


def drain(eng: Any) -> None:
    with torch.inference_mode():
        while eng.scheduler.has_work():
            eng.step()


def test_longest_prefix_match_is_admitted_first(make_engine: Any) -> None:
    eng = make_engine(max_running=1)
    shared = list(range(100, 180))
    eng.scheduler.add(seq(eng, shared + [1, 2], "warm"))
    drain(eng)
    cold, hot = seq(eng, list(range(300, 380)), "cold"), seq(eng, shared + [7, 8], "hot")
    eng.scheduler.add(cold)
    eng.scheduler.add(hot)  # arrived later, but 80 tokens of it are cached
    with torch.inference_mode():
        eng.step()
    assert [s.request_id for s in eng.scheduler.running] == ["hot"]
    assert hot.cached_tokens == len(shared)
    drain(eng)


def test_requests_sharing_an_uncached_prefix_wait_for_it(make_engine: Any) -> None:
    eng = make_engine()
    shared = list(range(500, 600))
    a, b = seq(eng, shared + [1, 2, 3], "a"), seq(eng, shared + [4, 5, 6], "b")
    eng.scheduler.add(a)
    eng.scheduler.add(b)
    with torch.inference_mode():
        eng.step()
        assert [s.request_id for s in eng.scheduler.running] == ["a"]  # b deferred
        eng.step()
    assert b.cached_tokens == len(shared)  # b found a's prompt in the tree
    drain(eng)
    assert eng.scheduler.stats.prefill_tokens == len(shared) + 3 + 3


def test_step_respects_token_budget_and_chunk_size(make_engine: Any) -> None:
    eng = make_engine(chunk_size=40, max_num_batched_tokens=64, enable_prefix_cache=False)
    for i in range(3):
        eng.scheduler.add(seq(eng, list(range(1000 + 100 * i, 1090 + 100 * i)), f"r{i}"))
    with torch.inference_mode():
        for _ in range(12):
            batch = eng.scheduler.schedule()
            if not batch:
                break
            assert sum(it.n for it in batch) <= 64
            assert all(it.n <= 40 for it in batch)
            logits, ready = eng.runner.run(batch)
            eng.scheduler.complete_step(batch)
            for item, tok in zip(ready, logits.argmax(-1).tolist()):
                eng._append(item.seq, [tok])
    drain(eng)
    assert eng.scheduler.stats.prefill_tokens == 3 * 90


def test_retracted_request_keeps_its_completion_and_reuses_its_kv(make_engine: Any) -> None:
    eng = make_engine()
    s = seq(eng, list(range(40, 60)), "r")
    eng.scheduler.add(s)
    with torch.inference_mode():
        for _ in range(3):
            eng.step()
    done = list(s.token_ids)
    eng.scheduler.retract(s)
    assert s in eng.scheduler.waiting and s.slots == [] and s.token_ids == done
    assert eng.stats()["kv_slots_used"] == eng.cache.total_size  # its KV went to the tree
    drain(eng)
    assert s.token_ids[: len(done)] == done and s.num_completion == 4
    ref = make_engine(enable_prefix_cache=False)
    assert ref.generate_batch([list(range(40, 60))], PARAMS)[0] == s.token_ids[20:]
