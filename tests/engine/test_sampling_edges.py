"""Every sampling value ``SamplingParams.validate`` accepts gives a finite distribution; every
value it refuses names its field (issue 20, High 2: ``temperature: 1e-40`` made the sampler raise
``probability tensor contains inf/nan`` and the engine failed every request).

The property test draws parameters across the whole accepted range, edges included (temperature
0, denormals, just under and at ``TEMPERATURE_FLOOR``, 2; top_p 5e-324; min_p 1; penalties ±2;
logit_bias ±100; repetition_penalty 1e-6 / 1e6) and logits with masks and huge magnitudes. It
found two values vLLM's rules accept that fp32 cannot: repetition_penalty 1e-300 (0 in fp32:
-inf * 0 = NaN) and temperature 1e39 (inf in fp32: -inf / inf = NaN); both are refused now."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.local_engine.sched.api_types import InvalidSamplingParam, SamplingParams
from prefixgate.local_engine.sched.sampler import (
    TEMPERATURE_FLOOR,
    SamplingError,
    adjust_logits,
    is_greedy,
    make_generator,
    probs_of,
    sample,
    sample_rows,
)

V = 64
TEMPS = [0.0, 5e-324, 1e-320, 1e-40, 1e-30, TEMPERATURE_FLOOR * (1 - 1e-9), TEMPERATURE_FLOOR,
         0.02, 0.7, 1.0, 2.0]


@st.composite
def rows(draw: Any) -> torch.Tensor:
    """A logits row [V] with at least one finite value: normal, huge (±1e38) or masked."""
    vals = draw(st.lists(st.one_of(st.floats(-50, 50), st.sampled_from([-3e38, 3e38, -1e20, 0.0]),
                                   st.just(float("-inf"))), min_size=V, max_size=V))
    vals[draw(st.integers(0, V - 1))] = draw(st.floats(-1e6, 1e6))
    return torch.tensor(vals, dtype=torch.float32)


params = st.builds(
    SamplingParams,
    temperature=st.sampled_from(TEMPS),
    top_p=st.sampled_from([5e-324, 1e-300, 0.1, 0.9, 1.0]),
    top_k=st.sampled_from([-1, 1, 2, V - 1, V, 10**18]),
    min_p=st.sampled_from([0.0, 1e-300, 0.5, 1.0]),
    presence_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    frequency_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    repetition_penalty=st.sampled_from([1e-6, 0.5, 1.0, 1.3, 1e6]),
    logit_bias=st.dictionaries(st.integers(0, V - 1), st.sampled_from([-100.0, -1.0, 100.0]),
                               max_size=4),
    seed=st.sampled_from([None, -(2**63), 0, 2**64 - 1]),
)


@settings(max_examples=300)
@given(row=rows(), p=params, history=st.lists(st.integers(0, V - 1), max_size=12))
def test_every_accepted_value_gives_a_finite_distribution(row: torch.Tensor, p: SamplingParams,
                                                          history: list[int]) -> None:
    p.validate(V)  # accepted ...
    adjusted = adjust_logits(row, p, history, len(history) // 2)
    probs = probs_of(adjusted[None], p)[0]  # ... so finite, summing to 1
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-4)
    tok = sample(adjusted[None], [p], [make_generator(p.seed, torch.device("cpu"))])[0]
    assert 0 <= tok < V and probs[tok] > 0
    if is_greedy(p):
        assert tok == int(adjusted.argmax())


@pytest.mark.parametrize("temp", [1e-40, 1e-320, 5e-324, TEMPERATURE_FLOOR / 2])
def test_temperatures_below_the_floor_are_greedy(temp: float) -> None:
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])
    p = SamplingParams(temperature=temp)
    assert is_greedy(p) and not is_greedy(SamplingParams(temperature=TEMPERATURE_FLOOR))
    gens = [make_generator(s, torch.device("cpu")) for s in range(20)]
    assert sample(logits.expand(20, 4).contiguous(), [p] * 20, gens) == [1] * 20


def test_the_floor_itself_still_samples_near_ties() -> None:
    """At T = 0.01 a logit gap of 0.01 is e:1, not greedy (the floor is vLLM's clamp value)."""
    logits = torch.tensor([[0.0, 0.01]])
    p = SamplingParams(temperature=TEMPERATURE_FLOOR)
    gens = [make_generator(s, torch.device("cpu")) for s in range(200)]
    assert set(sample(logits.expand(200, 2).contiguous(), [p] * 200, gens)) == {0, 1}


def test_rows_without_a_distribution_fail_alone() -> None:
    good = torch.zeros(V)
    bad = [torch.full((V,), float("nan")), torch.full((V,), float("-inf")),
           torch.zeros(V).index_fill(0, torch.tensor([3]), float("inf"))]
    logits = torch.stack([good, *bad, good])
    ps = [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(temperature=0.0),
          SamplingParams(), SamplingParams(temperature=0.5, seed=1)]
    out = sample_rows(logits, ps, [make_generator(1, torch.device("cpu"))] * 5)
    assert [isinstance(t, SamplingError) for t in out] == [False, True, True, True, False]
    with pytest.raises(SamplingError):
        probs_of(bad[0][None], SamplingParams())


REFUSED = [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1e-9),
    ("temperature", 2.0001), ("temperature", 1e39),
    ("top_p", 0.0), ("top_p", 1.0000001), ("top_p", float("nan")),
    ("top_k", 0), ("top_k", -2), ("top_k", True), ("top_k", 2.0),
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", float("nan")),
    ("presence_penalty", 2.01), ("frequency_penalty", -2.5), ("frequency_penalty", float("inf")),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")),
    ("repetition_penalty", 1e-300), ("repetition_penalty", 1e300),
    ("logit_bias", {-1: 1.0}), ("logit_bias", {V: 1.0}), ("logit_bias", {True: 1.0}),
    ("logit_bias", {"5": 1.0}), ("logit_bias", {5: 100.5}), ("logit_bias", {5: float("nan")}),
    ("seed", 2**64), ("seed", -(2**63) - 1), ("seed", True), ("seed", 1.5),
    ("max_tokens", 0), ("max_tokens", True),
]


@pytest.mark.parametrize("field,value", REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_values_outside_the_ranges_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidSamplingParam) as ei:
        SamplingParams(**{field: value}).validate(V)
    assert ei.value.param == field and isinstance(ei.value, ValueError)


def test_logit_bias_forces_and_bans() -> None:
    logits = torch.tensor([0.0, 5.0, 1.0, 2.0])
    forced = adjust_logits(logits, SamplingParams(logit_bias={2: 100.0}), [], 0)
    assert int(forced.argmax()) == 2
    banned = adjust_logits(logits, SamplingParams(logit_bias={1: -100.0}), [], 0)
    assert int(banned.argmax()) == 3
    masked = logits.clone()
    masked[2] = float("-inf")  # a grammar mask is not lifted by a bias
    assert adjust_logits(masked, SamplingParams(logit_bias={2: 100.0}), [], 0)[2] == float("-inf")


def test_penalties_follow_openai_and_ctrl() -> None:
    logits = torch.tensor([1.0, 2.0, -1.0, 0.5])
    history = [3, 0, 1, 1, 2]  # prompt [3], completion [0, 1, 1, 2]
    got = adjust_logits(logits, SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
                        history, 1)
    # l[j] -= c[j] * 0.5 + (c[j] > 0) * 0.25, c over the completion only (token 3 is prompt)
    assert got.tolist() == [1.0 - 0.75, 2.0 - 1.25, -1.0 - 0.75, 0.5]
    rep = adjust_logits(logits, SamplingParams(repetition_penalty=2.0), history, 1)
    assert rep.tolist() == [0.5, 1.0, -2.0, 0.25]  # prompt + completion; >0 divided, <0 times
