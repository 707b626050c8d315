"""One request's failure fails that request alone (issue 20, High 2: one request with
``temperature: 1e-40`` made the sampling step raise and the engine failed every in-flight request
of every tenant).

Each poisoned kind runs in a batch with healthy requests, which must finish with exactly the
tokens they get alone (greedy, and seeded sampling): the issue's temperatures (fp32 and int8),
and kinds it does not name — a logits processor that raises, one that returns NaN, a mask that
allows no token, a sink whose event loop is gone, a forward pass that raises for one request's
tokens, a drafter that raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sampler import SamplingError, adjust_logits
from prefixgate.local_engine.spec.decode import SpecDecoder
from prefixgate.local_engine.spec.drafters import Draft, NgramDrafter

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=10, temperature=0.9, seed=11, ignore_eos=True)
HEALTHY = [(list(range(300, 316)), GREEDY), (list(range(500, 509)), SEEDED),
           (list(range(900, 930)), GREEDY)]
POISON_TOKEN = 4242  # the prompt of the poisoned request (the forward poison looks for it)
POISON_PROMPT = [POISON_TOKEN, 1, 2, 3, 4, 5]


def _raising(_: list[int], __: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("grammar state broken")


def _nan(_: list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, float("nan"))


def _nothing_allowed(_: list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, float("-inf"))


def _after(n: int, proc: Callable[[list[int], torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    """``proc`` from the request's ``n``-th token on (it fails mid-decode, not at its first)."""
    return lambda done, logits: proc(done, logits) if len(done) >= n else logits


def _run(eng: Any, jobs: list[tuple[list[int], SamplingParams]]) -> list[list[int] | BaseException]:
    async def one(prompt: list[int], p: SamplingParams) -> list[int]:
        return [t async for o in eng.generate(prompt, p) for t in o.new_token_ids]

    async def main() -> list[list[int] | BaseException]:
        return await asyncio.gather(*(one(pr, p) for pr, p in jobs), return_exceptions=True)
    return asyncio.run(main())


def _alone(eng: Any) -> list[list[int]]:
    return [eng.generate_batch([pr], p)[0] for pr, p in HEALTHY]


def _idle(eng: Any) -> None:
    st = eng.stats()
    assert st["num_running"] == 0 and st["num_waiting"] == 0
    assert st["kv_slots_used"] == st["kv_slots_cached"]  # nothing leaked outside the tree


@pytest.mark.parametrize("proc", [_raising, _nan, _nothing_allowed, _after(3, _raising),
                                  _after(4, _nan)],
                         ids=["raises", "nan", "no-token", "raises-mid-decode", "nan-mid-decode"])
def test_a_poisoned_processor_fails_only_its_request(tiny_engine: Any, proc: Any) -> None:
    alone = _alone(tiny_engine)
    poisoned = SamplingParams(max_tokens=10, temperature=0.7, ignore_eos=True,
                              logits_processors=[proc])
    got = _run(tiny_engine, [HEALTHY[0], (POISON_PROMPT, poisoned), *HEALTHY[1:]])
    assert isinstance(got[1], (RuntimeError, SamplingError))
    assert [got[0], *got[2:]] == alone
    _idle(tiny_engine)
    assert _alone(tiny_engine) == alone  # and the engine keeps serving


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_the_issues_temperatures_are_greedy_and_harm_no_one(make_engine: Any,
                                                           quantization: str | None) -> None:
    eng = make_engine(quantization=quantization)
    alone = _alone(eng)
    greedy = eng.generate_batch([POISON_PROMPT], GREEDY)[0]
    tiny = [SamplingParams(max_tokens=10, temperature=t, ignore_eos=True)
            for t in (1e-40, 1e-320, 5e-324, 0.009)]
    got = _run(eng, [*[(POISON_PROMPT, p) for p in tiny], *HEALTHY])
    assert all(isinstance(g, list) and len(g) == 10 for g in got)  # nobody failed
    if quantization is None:  # int8's on-the-fly activation scales depend on the batch
        assert got[:4] == [greedy] * 4 and got[4:] == alone


def test_a_sink_whose_loop_is_gone_drops_only_its_request(tiny_engine: Any) -> None:
    alone = _alone(tiny_engine)
    calls = []

    def dead_sink(item: Any) -> None:
        calls.append(item)
        raise RuntimeError("Event loop is closed")

    seq = tiny_engine._make_seq(POISON_PROMPT, GREEDY, None, "dead-sink", dead_sink)
    tiny_engine._submit(seq)
    got = _run(tiny_engine, HEALTHY)
    assert got == alone and len(calls) == 1  # told once, then dropped
    _idle(tiny_engine)


def test_a_forward_that_fails_for_one_request_reruns_the_others_alone(make_engine: Any) -> None:
    eng = make_engine()
    alone = _alone(eng)
    real_run = eng.runner.run

    def run(batch: list[Any]) -> Any:
        if any(it.seq.token_ids[0] == POISON_TOKEN for it in batch):
            raise RuntimeError("CUDA error: an illegal memory access")
        return real_run(batch)

    eng.runner.run = run
    got = _run(eng, [HEALTHY[0], (POISON_PROMPT, GREEDY), *HEALTHY[1:]])
    assert isinstance(got[1], RuntimeError) and [got[0], *got[2:]] == alone
    _idle(eng)
    assert eng.cache.peek_prefix_len(POISON_PROMPT, None) == 0  # its K/V never reached the tree


def test_a_raising_drafter_costs_only_the_draft(make_engine: Any) -> None:
    eng = make_engine(speculative="ngram")
    alone = _alone(eng)

    def broken(seq: Any, k: int) -> Any:
        raise IndexError("drafter bug")

    eng.spec.drafter.propose = broken
    assert _run(eng, HEALTHY) == alone
    assert eng.stats()["spec_num_drafts"] == 0


def test_penalties_with_speculation_give_the_plain_tokens(make_engine: Any) -> None:
    """End to end: biases and penalties under n-gram drafting give the plain tokens."""
    prompt = list(range(40, 52))
    bias = {5000: 100.0, 6000: 99.5, 7000: 99.0}
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, frequency_penalty=0.4,
                       presence_penalty=2.0, repetition_penalty=1.01, logit_bias=bias)
    plain = make_engine().generate_batch([prompt], p)[0]
    assert set(plain) <= set(bias) and len(set(plain)) >= 2  # the penalties did act
    spec = make_engine(speculative="ngram", spec_max_batch_tokens=4096)
    assert spec.generate_batch([prompt], p)[0] == plain
    assert spec.stats()["spec_num_accepted_tokens"] > 0


def test_verify_adjusts_each_row_with_the_drafts_before_it() -> None:
    """Row i of a verification sees history + draft[:i]: with equal model logits everywhere,
    a bias and a frequency penalty make plain greedy decoding alternate; a draft of that plain
    continuation is accepted whole, and the bonus token is plain's next one."""
    vocab, k = 8, 4
    p = SamplingParams(temperature=0.0, logit_bias={3: 1.0, 5: 0.5}, frequency_penalty=2.0,
                       presence_penalty=0.25)
    history = [1, 2]  # the prompt
    plain: list[int] = []
    for _ in range(k + 1):
        row = adjust_logits(torch.zeros(vocab), p, history + plain, len(history))
        plain.append(int(row.argmax()))
    assert len(set(plain)) > 1
    seq = SimpleNamespace(request_id="r", params=p, token_ids=list(history), num_prompt=2,
                          generator=torch.Generator(), spec_drafts=0, spec_draft_tokens=0,
                          spec_accepted_tokens=0)
    dec = SpecDecoder(NgramDrafter(), k_max=k)
    accepted, nxt = dec.verify(seq, torch.zeros(k + 1, vocab), Draft(plain[:k]))  # type: ignore[arg-type]
    assert (accepted, nxt) == (plain[:k], plain[k])
