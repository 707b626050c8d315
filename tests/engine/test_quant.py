"""int8 weight-only quantization: per-channel error bound, engine runs by flag, top-1 agreement."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.quant.int8 import Int8Linear
from prefixgate.local_engine.sched.api_types import SamplingParams


def test_per_channel_scales_bound_the_weight_error() -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 64) * torch.linspace(0.01, 2.0, 96)[:, None]  # rows of very different size
    q = Int8Linear(w, None)
    err = (q.dequantized() - w).abs()
    assert bool((err <= q.scale[:, None] / 2 + 1e-7).all())  # round-to-nearest, per row
    assert q.qweight.dtype == torch.int8 and int(q.qweight.abs().max()) == 127


def test_int8_product_is_close_to_fp32() -> None:
    torch.manual_seed(1)
    w, b, x = torch.randn(128, 64) * 0.1, torch.randn(128), torch.randn(5, 64)
    ref = F.linear(x, w, b)
    got = Int8Linear(w, b)(x)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert float((got - ref).norm() / ref.norm()) < 0.03


def test_engine_int8_by_flag_agrees_with_fp32_on_the_top_token(make_engine: Any) -> None:
    rng = random.Random(3)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(5, 40))] for _ in range(30)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ref = make_engine().generate_batch(prompts, one)
    q = make_engine(quantization="int8")
    got = q.generate_batch(prompts, one)
    agree = sum(a == b for a, b in zip(ref, got)) / len(prompts)
    assert agree >= 0.9, agree
    assert q.model.decoder_layers()[0].qkv.weight.numel() == 0  # fp32 copies dropped


def test_unknown_quantization_is_rejected(make_engine: Any) -> None:
    with pytest.raises(ValueError, match="unknown quantization"):
        make_engine(quantization="int3")
