"""Background priority in the scheduler (vLLM's ``priority``; the meaning guard's trials).

Rule (``sched.scheduler``, "Priority"): a background request (priority > 0) is admitted, and
its prefill chunks run, only in a step where no client's (priority 0) request waits or runs. The tests vary who arrives first, whether the client's
request arrives while the background one is mid-prefill, the cache state, and the number of
requests; each rule's break (a background request admitted beside a waiting client's, a chunk
of it run while a client's prefills, background never served) fails one of them.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.sched.api_types import InvalidSamplingParam, SamplingParams
from prefixgate.local_engine.sched.scheduler import Scheduler
from prefixgate.local_engine.sched.sequence import Sequence, Status
from tests.engine.test_scheduler_pool_pressure import make, run_all


def req(rid: str, prompt: list[int], max_tokens: int = 2, priority: int = 0) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            priority=priority)
    return Sequence(rid, prompt, params, max_tokens, None, torch.Generator(), None,  # type: ignore[arg-type]
                    set(), lambda out: None)


def scheduled(s: Scheduler) -> list[tuple[str, bool]]:
    """One step; (request id, is a prefill chunk) of what it computed."""
    batch = s.schedule()
    out = [(item.seq.request_id, not item.is_decode) for item in batch]
    from tests.engine.test_scheduler_pool_pressure import TOKEN, conserved
    for seq in s.complete_step(batch):
        seq.token_ids.append(TOKEN)
        if seq.num_completion >= seq.max_tokens:
            s.finish(seq)
    conserved(s)
    return out


@pytest.mark.parametrize("cache", [True, False])
@pytest.mark.parametrize("background_first", [True, False])
def test_a_waiting_clients_request_is_admitted_before_a_background_one(
        background_first: bool, cache: bool) -> None:
    s = make(slots=256, budget=64, chunk=16, running=4, cache=cache)
    bg = req("bg", list(range(100, 140)), priority=1)
    client = req("client", list(range(200, 240)))
    for r in ([bg, client] if background_first else [client, bg]):
        s.add(r)
    first = scheduled(s)
    assert ("client", True) in first and all(rid != "bg" for rid, _ in first)
    assert bg in s.waiting


def test_a_background_prefill_yields_its_chunks_to_a_client_that_arrives_mid_prefill() -> None:
    s = make(slots=256, budget=64, chunk=8, running=4)
    bg = req("bg", list(range(100, 164)), priority=1)  # 64 tokens: 8 chunks of 8
    s.add(bg)
    assert scheduled(s) == [("bg", True)]  # idle engine: background work runs
    client = req("client", list(range(300, 332)))  # 32 tokens: 4 chunks
    s.add(client)
    for i in range(5):  # while the client's request prefills and decodes: no background chunk
        got = scheduled(s)
        assert ("bg", True) not in got
        assert (("client", True) in got) == (i < 4)
    assert client.num_completion == 2 and bg.num_computed == 8
    run_all(s)
    assert bg.num_completion == 2 and client.num_completion == 2  # background served after


@pytest.mark.parametrize("cache", [True, False])
def test_background_requests_are_served_when_no_client_waits_lowest_value_first(cache: bool) -> None:
    s = make(slots=256, budget=16, chunk=16, running=1, cache=cache)
    low, high = req("p5", list(range(100, 116)), priority=5), req("p1", list(range(200, 216)), priority=1)
    s.add(low)
    s.add(high)
    assert scheduled(s)[0] == ("p1", True)
    run_all(s)
    assert low.num_completion == 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_client=st.integers(1, 4), n_bg=st.integers(1, 4), arrive=st.integers(0, 6),
       chunk=st.sampled_from([4, 8, 16]))
def test_no_step_prefills_background_while_a_clients_request_is_in_the_engine(
        n_client: int, n_bg: int, arrive: int, chunk: int) -> None:
    s = make(slots=512, budget=32, chunk=chunk, running=8)
    bgs = [req(f"bg{i}", [1000 + 50 * i + j for j in range(24)], priority=1) for i in range(n_bg)]
    clients = [req(f"c{i}", [5000 + 50 * i + j for j in range(20)]) for i in range(n_client)]
    for r in bgs:
        s.add(r)
    for _ in range(arrive):
        scheduled(s)
    for r in clients:
        s.add(r)
    for _ in range(200):
        if not s.has_work():
            break
        unfinished = any(c.status is not Status.FINISHED for c in clients)
        got = scheduled(s)
        if unfinished:
            assert not any(rid.startswith("bg") and chunk_ for rid, chunk_ in got)
    assert all(r.num_completion == 2 for r in bgs + clients)


def test_a_negative_priority_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidSamplingParam) as e:
        SamplingParams(priority=-1).validate()
    assert e.value.param == "priority"
    SamplingParams(priority=0).validate()
    SamplingParams(priority=3).validate()
