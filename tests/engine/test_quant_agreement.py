"""The int8 agreement metrics (first token, teacher-forced) and products kept fp32 by kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prefixgate.local_engine.model.llama import load_model
from prefixgate.local_engine.model.quant.int8 import KINDS, Int8Linear, quantize_model
from prefixgate.local_engine.model.quant.sensitivity import agreement, first_token_agreement


def test_first_token_agreement_is_the_share_of_prompts_with_the_same_token() -> None:
    assert first_token_agreement([5, 7, 9, 11], [5, 8, 9, 11]) == 0.75
    assert first_token_agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert first_token_agreement([1, 2, 3], [3, 1, 2]) == 0.0
    assert first_token_agreement([4, 4, 4], [4, 9, 9]) == 0.3333  # rounded to 4 places


@pytest.mark.parametrize("ref, got", [([], []), ([1, 2], [1]), ([1], [1, 2])])
def test_first_token_agreement_refuses_unequal_or_empty_lists(ref: list[int], got: list[int]) -> None:
    with pytest.raises(ValueError, match="equal, non-empty"):
        first_token_agreement(ref, got)


def test_agreement_reads_the_last_position_and_weights_positions_not_prompts() -> None:
    ref = [torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), torch.tensor([9, 9])]
    got = [torch.tensor([0, 2, 3, 4, 5, 6, 7, 8]),  # first position differs, last agrees
           torch.tensor([9, 8])]                     # last position differs
    out = agreement(ref, got)
    assert out["first_token_agreement"] == 0.5
    assert out["disagreeing_prompts"] == [1]
    assert out["teacher_forced_agreement"] == 0.8  # 8 of 10 positions (per-prompt mean: 0.6875)


def test_agreement_of_identical_runs_is_one_and_no_prompt_disagrees() -> None:
    ref = [torch.tensor([3, 1, 4]), torch.tensor([1, 5])]
    assert agreement(ref, [r.clone() for r in ref]) == {
        "first_token_agreement": 1.0, "teacher_forced_agreement": 1.0, "disagreeing_prompts": []}


def test_agreement_refuses_mismatched_prompts() -> None:
    with pytest.raises(ValueError, match="positions against"):
        agreement([torch.tensor([1, 2, 3])], [torch.tensor([1, 2])])
    with pytest.raises(ValueError, match="equal, non-empty"):
        agreement([torch.tensor([1])], [])
    with pytest.raises(ValueError, match="equal, non-empty"):
        agreement([], [])


def _fp32(tiny_dir: Path) -> Any:
    return load_model(str(tiny_dir), torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("kinds", [("qkv",), ("down",), ("o", "gate_up")])
def test_kept_kinds_stay_full_precision_in_every_layer(tiny_dir: Path, kinds: tuple[str, ...]) -> None:
    model = quantize_model(_fp32(tiny_dir), "int8", [], True, keep_kinds=kinds)
    for layer in model.decoder_layers():
        prods = dict(zip(KINDS, (layer._w[1], layer._w[3], layer._w[5], layer._w[6])))
        assert {k for k, p in prods.items() if not isinstance(p, Int8Linear)} == set(kinds)
        assert layer._w[2] is None  # the q|k|v bias went into the product, kept or not


def test_kept_qkv_keeps_its_bias(tiny_dir: Path) -> None:
    ref = _fp32(tiny_dir)
    lyr = ref.decoder_layers()[0]
    bias = torch.randn(lyr._w[1].shape[0])
    x = torch.randn(3, lyr._w[1].shape[1])
    want = torch.nn.functional.linear(x, lyr._w[1], bias)
    lyr._w = (lyr._w[0], lyr._w[1], bias, *lyr._w[3:])  # type: ignore[assignment]
    model = quantize_model(ref, "int8", [], True, keep_kinds=("qkv",))
    assert torch.allclose(model.decoder_layers()[0]._w[1](x), want, atol=1e-4, rtol=0)


def test_unknown_kept_kind_is_refused(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown keep_kinds"):
        quantize_model(_fp32(tiny_dir), "int8", keep_kinds=("mlp",))
