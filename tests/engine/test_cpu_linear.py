"""oneDNN packed fp32 linear layers: same products as F.linear, same greedy tokens."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.quant import cpu_linear
from prefixgate.local_engine.sched.api_types import SamplingParams

pytestmark = pytest.mark.skipif(not cpu_linear.available(torch.device("cpu"), torch.float32),
                                reason="torch without oneDNN")


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_product_matches_f_linear(rows: int) -> None:
    torch.manual_seed(rows)
    w, b, x = torch.randn(96, 64), torch.randn(96), torch.randn(rows, 64)
    got = cpu_linear.PackedLinear(w, b)(x)
    assert got.shape == (rows, 96)
    assert torch.allclose(got, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_engine_with_and_without_packing_gives_the_same_greedy_tokens(make_engine: Any) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(3, 30))] for _ in range(8)]
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    packed = make_engine()
    assert packed.model.decoder_layers()[0].qkv.weight.numel() == 0  # packed by default
    assert packed.generate_batch(prompts, p) == make_engine(packed_linear=False).generate_batch(
        prompts, p)
