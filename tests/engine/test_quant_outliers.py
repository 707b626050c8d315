"""int8 with outlier channels in fp32 (LLM.int8()'s decomposition), calibrated at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model import load_model
from prefixgate.local_engine.quant import Int8Linear, activation_channel_max, calibration_ids, quantize_model
from prefixgate.local_engine.quant_sensitivity import prefill

IDS = [1, 504, 3287, 314, 253, 1345, 28, 2683, 30, 7, 4199, 198, 88, 1020, 12, 40000, 9, 301]


def _fp32(tiny_dir: Path) -> Any:
    return load_model(str(tiny_dir), torch.device("cpu"), torch.float32)


def _outlier_rows(rows: int) -> torch.Tensor:
    torch.manual_seed(2)
    x = torch.randn(rows, 64)
    x[:, 5] *= 60.0
    return x


@pytest.mark.parametrize("rows", [1, 6])
def test_an_outlier_channel_in_fp32_cuts_the_error(rows: int) -> None:
    torch.manual_seed(1)
    w, b, x = torch.randn(96, 64) * 0.05, torch.randn(96), _outlier_rows(rows)
    ref = F.linear(x, w, b)
    plain = (Int8Linear(w, b)(x) - ref).norm()
    split = (Int8Linear(w, b, torch.tensor([5]))(x) - ref).norm()
    assert split < plain / 5


def test_every_channel_in_fp32_is_the_fp32_product() -> None:
    torch.manual_seed(3)
    w, x = torch.randn(40, 32), torch.randn(4, 32)
    got = Int8Linear(w, None, torch.arange(32))(x)
    assert torch.allclose(got, F.linear(x, w), atol=1e-4, rtol=0)
    assert not torch.allclose(Int8Linear(w, None)(x), F.linear(x, w), atol=1e-4, rtol=0)


def test_calibration_ids_are_fixed_and_in_the_vocabulary() -> None:
    ids = calibration_ids(1000, 300)
    assert ids == calibration_ids(1000, 300) and len(ids) == 300
    assert min(ids) >= 0 and max(ids) < 1000 and len(set(ids)) > 200


def test_quantize_model_splits_off_the_calibrated_largest_channels(tiny_dir: Path) -> None:
    ref = _fp32(tiny_dir)
    lyr = ref.decoder_layers()[1]
    stats = activation_channel_max(ref, calibration_ids(ref.args.vocab_size))
    want = {name: set(stats[id(w)].topk(3).indices.tolist())
            for name, w in (("qkv", lyr._w[1]), ("down", lyr._w[6]))}
    model = quantize_model(_fp32(tiny_dir), "int8", [0], keep_head=True, outlier_channels=3)
    got = model.decoder_layers()[1]._w
    assert set(got[1].chans.tolist()) == want["qkv"]
    assert set(got[6].chans.tolist()) == want["down"]
    assert isinstance(got[3], Int8Linear) and got[3].chans.numel() == 3
    assert not isinstance(model.decoder_layers()[0]._w[1], Int8Linear)  # kept layer untouched
    assert quantize_model(_fp32(tiny_dir), "int8").decoder_layers()[1]._w[1].chans is None


def test_outlier_channels_keep_the_logits_closer(tiny_dir: Path) -> None:
    ref = prefill(_fp32(tiny_dir), IDS)
    plain = prefill(quantize_model(_fp32(tiny_dir), "int8", keep_head=True), IDS)
    split = prefill(quantize_model(_fp32(tiny_dir), "int8", keep_head=True,
                                   outlier_channels=48), IDS)
    assert (split - ref).norm() < (plain - ref).norm()


def test_negative_outlier_channels_are_refused(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="outlier_channels"):
        quantize_model(_fp32(tiny_dir), "int8", outlier_channels=-1)
