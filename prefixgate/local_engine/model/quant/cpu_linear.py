"""fp32 linear layers on CPU through oneDNN with pre-packed weights.

A verification step of speculative decoding multiplies a handful of rows (decodes + draft
tokens) by every weight matrix. torch's default CPU path (``F.linear`` → MKL sgemm) handles such
skinny products poorly: measured here on SmolLM2-135M's shapes (1 thread), 5 rows cost ~3× one
row. oneDNN's ``_linear_pointwise`` on a weight reordered once into its blocked layout
(``_reorder_linear_weight``; the path torch.compile's CPU backend uses) costs ~1.6× for 5 rows and
is no slower for one. Numerics: same fp32 products, summed in another order (|Δ| ~ 1e-4 on
logits). Used for fp32 models on CPU when oneDNN is available; otherwise nothing changes.
"""

from __future__ import annotations

import torch

from prefixgate.local_engine.model.llama import CausalLM
from prefixgate.local_engine.model.quant import screened_head
from prefixgate.local_engine.model.quant.cpu_features import linear_any


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the packed path applies: fp32 on CPU with torch's oneDNN ops present."""
    return (device.type == "cpu" and dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """``y = x @ W.T (+ b)`` with ``W [out, in]`` reordered for oneDNN; ``__call__(x [T, in])``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
        self.bias = None if bias is None else bias.detach().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def pack_model(model: CausalLM) -> CausalLM:
    """Replace ``model``'s linear weights (and LM head) by ``PackedLinear`` in place; returns it.

    The float copies of the layers' matrices are dropped; the embedding table stays. Greedy
    steps get the argmax head (``screened_head``: int8 screen + exact rescoring).
    """

    for layer in model.decoder_layers():
        w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down = layer._w
        layer._w = (w_in, PackedLinear(w_qkv, b_qkv), None, PackedLinear(w_o, None),  # type: ignore[assignment]
                    w_post, PackedLinear(w_gu, None), PackedLinear(w_down, None))
        layer._mm = linear_any
        for mod in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
            mod.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    model._head = PackedLinear(model.head_weight(), None)
    screened_head.attach(model, model._head)
    if model.lm_head is not None:
        model.lm_head.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    return model
