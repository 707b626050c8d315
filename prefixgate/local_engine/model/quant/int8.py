"""int8 weight-only quantization of the decoder's linear layers (per-output-channel scales).

CPU decode reads every weight once per token, so its speed is bounded by weight bytes; int8 reads
a quarter of fp32's. Each weight ``W [out, in]`` becomes ``Wq = round(W / s)`` with one scale per
output channel ``s[o] = max|W[o, :]| / 127`` (symmetric, zero point 0), so ``W ≈ s[:, None] * Wq``.

On CPU the product runs in torch's fbgemm / oneDNN int8 kernels
(``torch.ops.quantized.linear_dynamic``: activations are quantized on the fly, int8 × int8 →
int32, rescaled to fp32). That kernel scales activations per tensor; dividing each row by its
absolute max first (and multiplying the output row back — the product is linear) makes the
activation scale per token, which keeps prefill rows of very different magnitudes accurate.
(The weights are int8 and the activations are quantized per token on the fly: "weight-only" in
storage; torch's weight-only int8 kernel ``_weight_int8pack_mm`` measured ~50x slower than fp32
here.) ``reduce_range`` (7-bit activations) is used only on CPUs without VNNI, where the AVX2
kernel's int16 accumulation can saturate. On other devices the int8 weights are dequantized
inside the matmul (``F.linear(x, Wq.to(dtype)) * s``): it saves weight memory, not time.
Embedding lookups keep the full-precision table.

What stays in full precision (issue 27: int8 everywhere moved greedy top-1 on 10 % of the
benchmark's prompts): the LM head (``keep_head``; ~20 % of SmolLM2-135M's weights, and alone
the largest single loss: teacher-forced top-1 agreement 0.945 with only the head int8), the
decoder layers ``keep_layers`` and the products ``keep_kinds``. The engine keeps
``sensitivity.kept_layers``: 6 layers, for SmolLM2-135M the six measured most sensitive
(0, 8, 9, 18, 28, 29; ``bench/int8_sensitivity.py``), chosen by ``bench/int8_keep_sweep.py``
(``bench/results/int8_keep_sweep.json``, first-token greedy agreement with fp32 on the int8
benchmark's prompts): those six 0.983 on its 60 prompts and 0.992 on 120, where the former
default (layers 0 and 29) gave 0.95, the 4 / 6 edge layers 0.967 / 0.95, 64 outlier channels
0.90 and q|k|v kept in every layer 0.967. Most disagreements are near ties (fp32's top-two
logit gap 0.01-0.05 on the prompts that flip). Speed, same benchmark on a quiet box
(``bench/engine_speculative.py``, no other benchmark or test running): batch-1 decode TPOT
31.5 ms int8 against 42.6 ms fp32 (1.35x; with no layer kept 31.4 against 45.5 ms, 1.45x), so
keeping the six costs no time measurable there; the 1.7x goal is not reached on a quiet box
(the earlier 1.97x was measured under heavy load, where weight bytes weigh more). Kept products
run as oneDNN pre-packed fp32 (``cpu_linear``) where available.
A kept head gets ``screened_head``'s argmax head on CPU:
greedy steps get the fp32 head's argmax from an int8 screen plus exact rescoring of the few
candidates, so keeping the head costs about what an int8 head does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.llama import CausalLM
from prefixgate.local_engine.model.quant import screened_head
from prefixgate.local_engine.model.quant.cpu_features import cpu_has_vnni as _cpu_has_vnni
from prefixgate.local_engine.model.quant.cpu_features import linear_any

METHODS = ("int8",)
KINDS = ("qkv", "o", "gate_up", "down")  # a decoder layer's linear products, in order
CALIBRATION_TOKENS = 256


class Int8Linear:
    """``y = x @ W.T (+ b)`` with ``W`` stored as int8 + per-output-channel fp32 scales.

    ``__call__(x [T, in]) -> [T, out]`` in ``x``'s dtype. ``weight``: the float ``[out, in]``
    matrix to quantize (not kept). ``outlier_channels``: input channel indices whose products
    run in fp32 (LLM.int8()'s decomposition, Dettmers et al. 2022: a few activation channels
    hold values ~50x the rest, and a per-token int8 scale set by them rounds every other
    channel coarsely); the int8 kernel gets the other channels. CPU only; None: none.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 outlier_channels: torch.Tensor | None = None) -> None:
        w = weight.detach().float()
        self.chans: torch.Tensor | None = None
        if outlier_channels is not None and outlier_channels.numel() and w.device.type == "cpu":
            self.chans = outlier_channels.to(torch.long)
            self.w_chans = w.index_select(1, self.chans).t().contiguous()  # [k, out] fp32
            self.keep_mask = torch.ones(w.shape[1])
            self.keep_mask[self.chans] = 0.0
        self.out_features = w.shape[0]
        self.scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0)
        self.bias = bias
        self.cpu = w.device.type == "cpu"
        if self.cpu:
            q = torch.quantize_per_channel(w, self.scale.double(), torch.zeros(
                w.shape[0], dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, None)
            self.reduce_range = not _cpu_has_vnni()
            self.qweight = q.int_repr()
        else:
            self.qweight = torch.round(w / self.scale[:, None]).clamp(-127, 127).to(torch.int8)

    def dequantized(self) -> torch.Tensor:
        """``s[:, None] * Wq`` as fp32 ``[out, in]`` (tests and error analysis)."""
        return self.qweight.float() * self.scale[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu:
            xf = x.float()
            xs = xf if self.chans is None else xf * self.keep_mask
            if xf.shape[0] == 1:  # one row: the per-tensor scale is already per token
                y = torch.ops.quantized.linear_dynamic(xs, self.packed, self.reduce_range)
            else:
                r = xs.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
                y = torch.ops.quantized.linear_dynamic(xs / r, self.packed, self.reduce_range) * r
            if self.chans is not None:
                y = torch.addmm(y, xf.index_select(1, self.chans), self.w_chans)
            if self.bias is not None:
                y = y + self.bias
            return y if y.dtype == x.dtype else y.to(x.dtype)
        y = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


def _full_precision(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    """The kept product: oneDNN-packed fp32 on CPU where available, else ``F.linear``."""
    from prefixgate.local_engine.model.quant import cpu_linear

    if cpu_linear.available(weight.device, weight.dtype):
        return cpu_linear.PackedLinear(weight, bias)
    w, b = weight.detach().clone(), None if bias is None else bias.detach().clone()
    return lambda x: F.linear(x, w, b)


def calibration_ids(vocab_size: int, n: int = CALIBRATION_TOKENS) -> list[int]:
    """``n`` token ids from a fixed seed (tokenizer-free, so any checkpoint gets the same
    recipe): the outlier channels of a Llama-family model's activations are structural, set by
    the weights, not by the text (LLM.int8(); "massive activations", Sun et al. 2024)."""
    g = torch.Generator().manual_seed(27)
    return torch.randint(0, vocab_size, (n,), generator=g).tolist()


def activation_channel_max(model: CausalLM, ids: list[int]) -> dict[int, torch.Tensor]:
    """Per linear product (keyed by ``id`` of its weight tensor): ``max |x|`` per input channel
    over a prefill of ``ids`` (fp32 model, layers bound, not yet quantized or packed)."""
    from prefixgate.local_engine.model.quant.sensitivity import prefill

    stats: dict[int, torch.Tensor] = {}

    def record(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        m = x.detach().abs().amax(dim=0).float().cpu()
        stats[id(w)] = m if id(w) not in stats else torch.maximum(stats[id(w)], m)
        return F.linear(x, w, b)

    layers = model.decoder_layers()
    saved = [lyr._mm for lyr in layers]
    for lyr in layers:
        lyr._mm = record
    try:
        prefill(model, ids)
    finally:
        for lyr, mm in zip(layers, saved):
            lyr._mm = mm
    return stats


def quantize_model(model: CausalLM, method: str, keep_layers: list[int] | None = None,
                   keep_head: bool = False, outlier_channels: int = 0,
                   keep_kinds: tuple[str, ...] = ()) -> CausalLM:
    """Quantize ``model``'s linear weights in place (``method``: ``int8``); returns it.

    ``keep_layers``: decoder layer indices left in full precision; ``keep_head``: the LM head
    too (module docstring). ``outlier_channels``: per int8 product, this many input channels
    (the largest ``max |x|`` over a calibration prefill of ``calibration_ids``) run in fp32
    (``Int8Linear``); 0: none. ``keep_kinds``: products (of ``KINDS``) left in full precision
    in every layer. Raises ``ValueError`` for an unknown method, a layer index out of range, an
    unknown kind or a negative ``outlier_channels``. Norm weights and the embedding table stay in
    the model dtype. Call after ``load_model`` (layers bound).
    """
    if outlier_channels < 0:
        raise ValueError("outlier_channels must be >= 0")
    if method not in METHODS:
        raise ValueError(f"unknown quantization {method!r} (one of {list(METHODS)})")
    keep = set(keep_layers or [])
    if set(keep_kinds) - set(KINDS):
        raise ValueError(f"unknown keep_kinds {sorted(set(keep_kinds) - set(KINDS))} (of {list(KINDS)})")
    n = len(model.decoder_layers())
    if any(not 0 <= i < n for i in keep):
        raise ValueError(f"keep_layers {sorted(keep)} out of range 0..{n - 1}")
    stats = activation_channel_max(model, calibration_ids(model.args.vocab_size)) \
        if outlier_channels else {}

    def int8(w: torch.Tensor, b: torch.Tensor | None) -> Int8Linear:
        m = stats.get(id(w))
        chans = None if m is None else m.topk(min(outlier_channels, m.numel())).indices
        return Int8Linear(w, b, chans)

    for i, layer in enumerate(model.decoder_layers()):
        w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down = layer._w
        mk = {k: _full_precision if i in keep or k in keep_kinds else int8 for k in KINDS}
        layer._w = (w_in, mk["qkv"](w_qkv, b_qkv), None,  # type: ignore[assignment]
                    mk["o"](w_o, None), w_post, mk["gate_up"](w_gu, None), mk["down"](w_down, None))
        layer._mm = linear_any
    model._head = (_full_precision if keep_head else Int8Linear)(model.head_weight(), None)
    if keep_head:  # greedy steps: the fp32 head's argmax at int8 cost (screened_head)
        screened_head.attach(model, model._head)
    for lyr in model.decoder_layers():  # free the float copies no longer read
        for mod in (lyr.qkv, lyr.o_proj, lyr.gate_up, lyr.down):
            mod.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    if model.lm_head is not None:
        model.lm_head.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    return model
