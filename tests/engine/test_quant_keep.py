"""int8 that keeps answers: the LM head and the edge layers stay fp32; per-layer tolerance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.llama import load_model
from prefixgate.local_engine.model.quant import sensitivity as quant_sensitivity
from prefixgate.local_engine.model.quant.cpu_features import cpu_has_vnni
from prefixgate.local_engine.model.quant.int8 import Int8Linear, quantize_model
from prefixgate.local_engine.model.quant.sensitivity import edge_layers, kept_layers, prefill

INT8_REL_TOL = 0.03  # ‖int8 − fp32‖ / ‖fp32‖ of one layer's product (measured ≤ 0.02 here)
IDS = [1, 504, 3287, 314, 253, 1345, 28, 2683, 30, 7, 4199, 198, 88, 1020, 12, 40000, 9, 301]


def test_edge_layers_go_from_the_ends_inwards() -> None:
    assert edge_layers(30, 2) == [0, 29]
    assert edge_layers(30, 3) == [0, 28, 29]
    assert edge_layers(30, 4) == [0, 1, 28, 29]
    assert edge_layers(3, 5) == [0, 1, 2]
    assert edge_layers(1, 1) == [0] and edge_layers(30, 0) == []


def _fp32(tiny_dir: Path) -> Any:
    return load_model(str(tiny_dir), torch.device("cpu"), torch.float32)


def test_each_int8_layer_product_matches_fp32_within_tolerance_bias_included(tiny_dir: Path) -> None:
    model = _fp32(tiny_dir)
    torch.manual_seed(0)
    for layer in model.decoder_layers():
        w_in, w_qkv, _, w_o, _, w_gu, w_down = layer._w
        bias = torch.randn(w_qkv.shape[0]) * 0.5  # a Qwen-style q|k|v bias
        for w, b in ((w_qkv, bias), (w_o, None), (w_gu, None), (w_down, None)):
            x = torch.randn(7, w.shape[1])
            ref, got = F.linear(x, w, b), Int8Linear(w, b)(x)
            assert float((got - ref).norm() / ref.norm()) <= INT8_REL_TOL
            if b is not None:  # the bias is added once, in full: dropping it breaks the bound
                no_bias = Int8Linear(w, None)(x)
                assert float((no_bias - ref).norm() / ref.norm()) > INT8_REL_TOL


def test_kept_layers_and_head_give_fp32_logits_exactly(tiny_dir: Path) -> None:
    ref = prefill(_fp32(tiny_dir), IDS)
    n = len(_fp32(tiny_dir).decoder_layers())
    kept = quantize_model(_fp32(tiny_dir), "int8", list(range(n)), keep_head=True)
    assert torch.allclose(prefill(kept, IDS), ref, atol=1e-3, rtol=0)
    one_int8 = quantize_model(_fp32(tiny_dir), "int8", [0], keep_head=True)  # layer 1 int8
    assert not torch.allclose(prefill(one_int8, IDS), ref, atol=1e-3, rtol=0)
    head_int8 = quantize_model(_fp32(tiny_dir), "int8", list(range(n)), keep_head=False)
    assert not torch.allclose(prefill(head_int8, IDS), ref, atol=1e-3, rtol=0)


def test_keeping_head_and_edges_raises_teacher_forced_agreement(tiny_dir: Path) -> None:
    ref = prefill(_fp32(tiny_dir), IDS * 3).argmax(-1)
    plain = prefill(quantize_model(_fp32(tiny_dir), "int8"), IDS * 3).argmax(-1)
    kept = prefill(quantize_model(_fp32(tiny_dir), "int8", [1], keep_head=True), IDS * 3).argmax(-1)
    assert float((kept == ref).float().mean()) >= float((plain == ref).float().mean())
    # random tiny weights: many near ties; 7-bit activations without VNNI (quant.int8
    # reduce_range) agree less: 0.80 measured on an AVX2-only CPU
    assert float((kept == ref).float().mean()) >= (0.85 if cpu_has_vnni() else 0.75)


def test_engine_int8_keeps_head_and_edge_layers_by_default(make_engine: Any) -> None:
    eng = make_engine(quantization="int8")
    layers = eng.model.decoder_layers()
    assert not isinstance(eng.model._head, Int8Linear)
    assert [not isinstance(lyr._w[1], Int8Linear) for lyr in layers] == [True, True]  # 2 layers, 2 kept
    eng2 = make_engine(quantization="int8", quant_fp32_layers=1, quant_fp32_head=False)
    assert isinstance(eng2.model._head, Int8Linear)
    assert [not isinstance(lyr._w[1], Int8Linear) for lyr in eng2.model.decoder_layers()] == [False, True]


def test_out_of_range_kept_layer_is_rejected(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="out of range"):
        quantize_model(_fp32(tiny_dir), "int8", [5])


def test_kept_layers_take_the_measured_ranking_then_the_ends() -> None:
    assert kept_layers(30, 576, 6) == [0, 8, 9, 18, 28, 29]  # SmolLM2-135M: measured
    assert kept_layers(30, 576, 2) == [18, 29]
    assert kept_layers(30, 576, 8) == [0, 1, 8, 9, 18, 27, 28, 29]  # then the edge order
    assert kept_layers(30, 576, 0) == []
    assert kept_layers(30, 64, 4) == [0, 1, 28, 29]  # an unmeasured shape: from the ends
    assert kept_layers(3, 64, 5) == [0, 1, 2]


def test_the_measured_ranking_is_the_sensitivity_runs() -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "results" / "int8_sensitivity.json"
    ranked = json.loads(path.read_text())["most_sensitive_layers"]
    assert list(quant_sensitivity.MEASURED_SENSITIVITY[(30, 576)]) == [int(i) for i in ranked]


def test_engine_int8_keeps_the_measured_layers_not_the_ends(make_engine: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixgate.local_engine.sched.api_types import EngineConfig

    assert EngineConfig(model_path="m").quant_fp32_layers == 6  # the chosen default
    monkeypatch.setitem(quant_sensitivity.MEASURED_SENSITIVITY, (2, 64), (0,))
    eng = make_engine(quantization="int8", quant_fp32_layers=1)  # the ends would keep layer 1
    assert [isinstance(lyr._w[1], Int8Linear) for lyr in eng.model.decoder_layers()] == [False, True]
    assert [isinstance(lyr._w[6], Int8Linear) for lyr in eng.model.decoder_layers()] == [False, True]


def test_an_unknown_kept_kind_is_rejected_by_name(tiny_dir: Path) -> None:
    model = _fp32(tiny_dir)
    with pytest.raises(ValueError, match=r"^unknown keep_kinds \['bogus'\] "
                                         r"\(of \['qkv', 'o', 'gate_up', 'down'\]\)$"):
        quantize_model(model, "int8", keep_kinds=("qkv", "bogus"))
