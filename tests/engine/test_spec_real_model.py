"""Speculative decoding and int8 on SmolLM2-135M (slow: loads the real model)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.local_engine.sched.api_types import SamplingParams
from tests.tiny_model import real_model_dir

TOOL = ('{"reservation_id": "ZFA04Y", "user_id": "mia_li_3668", "origin": "JFK", '
        '"destination": "SEA", "flight_type": "one_way", "cabin": "economy", '
        '"flights": [{"flight_number": "HAT136", "date": "2024-05-20", "price": 164}]}')


@pytest.mark.slow
def test_grounded_outputs_are_identical_and_mostly_accepted(make_engine: Any) -> None:
    from prefixgate.local_engine.server.chat import encode_chat

    d = real_model_dir()
    plain = make_engine(model_path=d, max_context_len=1024)
    spec = make_engine(model_path=d, max_context_len=1024, speculative="ngram+suffix")
    asks = [f"Restate this tool result exactly, as JSON:\n{TOOL}",
            f"Tool result:\n{TOOL}\n\nList every id in it, quoting them exactly.",
            "Write two sentences about the sea."]
    prompts = [encode_chat(plain.tokenizer, [{"role": "user", "content": a}]) for a in asks]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    assert spec.generate_batch(prompts, params) == plain.generate_batch(prompts, params)
    st = spec.stats()
    assert st["spec_acceptance_rate"] > 0.5 and st["spec_mean_accepted_len"] > 2.0


@pytest.mark.slow
def test_int8_real_model_agrees_with_fp32_on_greedy_tokens(make_engine: Any) -> None:
    d = real_model_dir()
    fp32 = make_engine(model_path=d, max_context_len=1024)
    q = make_engine(model_path=d, max_context_len=1024, quantization="int8")
    prompts = [fp32.tokenizer.encode(t) for t in (
        "The capital of France is", "def add(a, b):\n    return", "Flight HAT136 departs from",
        "1, 2, 3, 4,", "The customer's reservation id is ZFA04Y. The reservation id is")]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ref, got = fp32.generate_batch(prompts, one), q.generate_batch(prompts, one)
    assert sum(a == b for a, b in zip(ref, got)) >= 4
