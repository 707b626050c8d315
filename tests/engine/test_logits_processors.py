"""The engine's per-sequence logits-processor seam (``SamplingParams.logits_processors``)."""

from __future__ import annotations

from typing import Any

import torch

from prefixgate.local_engine.sched.api_types import SamplingParams
from prefixgate.local_engine.sched.sampler import prepare_row


class Forcer:
    """Forces ``script`` token by token; records the completions it was shown."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.seen: list[list[int]] = []

    def __call__(self, completion: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.seen.append(list(completion))
        out = torch.full_like(logits, float("-inf"))
        out[self.script[len(completion)]] = 0.0
        return out


def test_rows_without_processors_are_untouched() -> None:
    row = torch.randn(10)
    assert prepare_row(row, SamplingParams(), [1, 2], 2) is row
    forcer = Forcer([3, 4])
    forced = prepare_row(row, SamplingParams(logits_processors=[forcer]), [1, 2, 3], 2)
    assert int(forced.argmax()) == 4 and forcer.seen == [[3]]  # shown the completion only


def test_engine_applies_one_processor_per_sequence(tiny_engine: Any) -> None:
    a, b = Forcer([5, 6, 7, 8]), Forcer([9, 10, 11, 12])
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=1, ignore_eos=True,
                             logits_processors=[p]) for p in (a, b)]
    free = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    out = tiny_engine.generate_batch([[1, 2, 3], [1, 2, 4], [1, 2, 5]], [*params, free])
    assert out[0] == [5, 6, 7, 8] and out[1] == [9, 10, 11, 12]
    assert a.seen == [[], [5], [5, 6], [5, 6, 7]]
    assert len(out[2]) == 4
