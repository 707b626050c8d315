"""int8 with outlier channels in fp32 (LLM.int8()'s decomposition), calibrated at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.llama import load_model
from prefixgate.local_engine.model.quant import screened_head
from prefixgate.local_engine.model.quant.int8 import (
    CALIBRATION_TOKENS,
    Int8Linear,
    activation_channel_max,
    calibration_ids,
    quantize_model,
)
from prefixgate.local_engine.model.quant.sensitivity import prefill

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
    with pytest.raises(ValueError, match=r"^outlier_channels must be >= 0$"):
        quantize_model(_fp32(tiny_dir), "int8", outlier_channels=-1)


def _split_case(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [48, 32]``, bias ``[48]``, ``x [rows, 32]`` with huge values in channels 3 and 17,
    and those channels as a (deliberately int32) index tensor."""
    torch.manual_seed(4)
    w, b, x = torch.randn(48, 32) * 0.1, torch.randn(48), torch.randn(rows, 32)
    x[:, 3] = 5e3
    x[:, 17] = -2e3
    return w, b, x, torch.tensor([17, 3], dtype=torch.int32)


@pytest.mark.parametrize("rows", [1, 5])
def test_the_outlier_channels_run_in_fp32_and_the_rest_through_plain_int8(rows: int) -> None:
    w, b, x, chans = _split_case(rows)
    ref = F.linear(x, w, b)
    split = Int8Linear(w, b, chans)(x)
    plain = Int8Linear(w, b)(x)
    assert split.shape == ref.shape and split.dtype == torch.float32
    # the fp32 answer within a tight tolerance; plain int8 (the outliers set the row's scale) is not
    assert (split - ref).norm() / ref.norm() < 2e-4
    assert (plain - ref).norm() / ref.norm() > 5e-3
    # exactly: the other channels' int8 product + the outlier channels' fp32 product + the bias
    rest = x.clone()
    rest[:, [3, 17]] = 0.0
    want = Int8Linear(w, None)(rest) + x[:, [17, 3]] @ w[:, [17, 3]].t() + b
    assert torch.allclose(split, want, rtol=1e-5, atol=1e-3)


def test_the_split_keeps_its_mask_and_fp32_columns() -> None:
    w, b, _, chans = _split_case(1)
    lin = Int8Linear(w, b, chans)
    assert lin.chans is not None and lin.chans.dtype == torch.long and lin.chans.tolist() == [17, 3]
    assert lin.w_chans.shape == (2, 48) and torch.equal(lin.w_chans, w[:, [17, 3]].t())
    assert lin.w_chans.is_contiguous()
    assert lin.keep_mask.shape == (32,)
    assert lin.keep_mask.nonzero().flatten().tolist() == [i for i in range(32) if i not in (3, 17)]
    assert torch.all(lin.keep_mask[[3, 17]] == 0) and torch.all(lin.keep_mask.sum() == 30)
    assert torch.equal(lin.dequantized(), Int8Linear(w, b).dequantized())  # int8 weights unchanged


@pytest.mark.parametrize("rows", [1, 5])
def test_no_outlier_channels_is_plain_int8_bias_included(rows: int) -> None:
    w, b, x, _ = _split_case(rows)
    plain = Int8Linear(w, b)
    empty = Int8Linear(w, b, torch.tensor([], dtype=torch.long))
    assert empty.chans is None and Int8Linear(w, b, None).chans is None
    assert torch.equal(empty(x), plain(x))
    assert torch.allclose(plain(x) - Int8Linear(w, None)(x), b.expand(rows, -1), atol=1e-3)


def test_the_split_answers_in_the_input_dtype() -> None:
    w, b, x, chans = _split_case(3)
    got = Int8Linear(w, b, chans)(x.bfloat16())
    assert got.dtype == torch.bfloat16
    ref = F.linear(x.bfloat16().float(), w, b)
    assert (got.float() - ref).norm() / ref.norm() < 1e-2


def test_outlier_channels_zero_is_the_plain_int8_model(tiny_dir: Path) -> None:
    plain = quantize_model(_fp32(tiny_dir), "int8", keep_head=True)
    zero = quantize_model(_fp32(tiny_dir), "int8", keep_head=True, outlier_channels=0)
    for lyr in zero.decoder_layers():
        assert all(lyr._w[j].chans is None for j in (1, 3, 5, 6))
    assert torch.equal(prefill(zero, IDS), prefill(plain, IDS))


def test_more_outlier_channels_than_inputs_is_the_fp32_model(tiny_dir: Path) -> None:
    ref = _fp32(tiny_dir)
    widths = [(w.shape[1]) for lyr in ref.decoder_layers() for w in (lyr._w[1], lyr._w[3], lyr._w[5], lyr._w[6])]
    model = quantize_model(_fp32(tiny_dir), "int8", keep_head=True, outlier_channels=10_000)
    got = [lyr._w[j] for lyr in model.decoder_layers() for j in (1, 3, 5, 6)]
    assert [g.chans.numel() for g in got] == widths  # every input channel, each once
    assert all(sorted(g.chans.tolist()) == list(range(n)) for g, n in zip(got, widths))
    want = prefill(ref, IDS)
    assert torch.allclose(prefill(model, IDS), want, atol=1e-3, rtol=0)


def _recorded(model: Any, ids: list[int]) -> dict[int, torch.Tensor]:
    """The test's own ``max |x|`` per input channel of every decoder product over a prefill."""
    seen: dict[int, torch.Tensor] = {}

    def mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        m = x.abs().amax(dim=0)
        seen[id(w)] = torch.maximum(seen[id(w)], m) if id(w) in seen else m
        return F.linear(x, w, b)

    for lyr in model.decoder_layers():
        lyr._mm = mm
    prefill(model, ids)
    for lyr in model.decoder_layers():
        lyr._mm = F.linear
    return seen


def test_activation_channel_max_is_the_prefills_per_channel_max(tiny_dir: Path) -> None:
    model = _fp32(tiny_dir)
    layers = model.decoder_layers()
    w = layers[0]._w
    torch.manual_seed(6)  # a QKV bias (this tiny Llama has none): the calibration prefill must add it
    layers[0]._w = (w[0], w[1], torch.randn(w[1].shape[0]) * 3.0, *w[3:])
    layers[1]._w = layers[0]._w  # one weight read twice: its channel max spans both reads
    want = _recorded(model, IDS)
    got = activation_channel_max(model, IDS)
    assert all(lyr._mm is F.linear for lyr in layers)  # the layers are given back
    assert got.keys() == want.keys() and len(got) == 4 * (len(layers) - 1)
    for k, m in want.items():
        assert got[k].dtype == torch.float32 and torch.equal(got[k], m)
    assert torch.equal(prefill(model, IDS), prefill(model, IDS))


def test_activation_channel_max_gives_the_layers_back_on_an_error(tiny_dir: Path) -> None:
    model = _fp32(tiny_dir)
    with pytest.raises(ValueError):
        activation_channel_max(model, [])
    assert all(lyr._mm is F.linear for lyr in model.decoder_layers())


def test_calibration_ids_default_to_the_fixed_recipe() -> None:
    ids = calibration_ids(5000)
    assert len(ids) == CALIBRATION_TOKENS == 256
    # the recipe is a fixed seed (27): every checkpoint and every run calibrates on the same ids
    g = torch.Generator().manual_seed(27)
    assert ids == torch.randint(0, 5000, (256,), generator=g).tolist()


@pytest.mark.skipif(not screened_head.available(torch.zeros(1, 1)), reason="the screened head needs fbgemm")
def test_a_kept_head_gets_the_screened_argmax_head_with_the_kept_head_as_fallback(tiny_dir: Path) -> None:
    head_w = _fp32(tiny_dir).head_weight().detach().clone()
    model = quantize_model(_fp32(tiny_dir), "int8", keep_head=True, outlier_channels=4)
    torch.manual_seed(8)
    x = torch.randn(2, head_w.shape[1])
    x[1, 0] = float("nan")  # a non-finite row: the whole batch goes to the exact head
    got = model._argmax_head(x)
    assert got.shape == (2, head_w.shape[0]) and model._argmax_head.full_rows == 2
    assert torch.allclose(got[0], F.linear(x[:1], head_w)[0], atol=1e-4, rtol=0)
