"""The LM head's argmax at int8 cost: screen the vocabulary with int8, rescore the few candidates
in full precision, prove nothing else can win.

A greedy step (plain decode or the verify step of speculative decoding) needs only each row's
argmax, but the full-precision head reads ``vocab × hidden`` weights per row (SmolLM2-135M:
49152 × 576, ~20 % of the model) and, in a verify step, runs on every draft row. Here:

1. The ``k`` input channels with the largest ``max |x|`` seen so far (the final RMSNorm's
   output has a few channels ~50x the rest; re-picked after the calls in ``REFRESH_AT``) are
   multiplied in fp32 against their weight columns (a ``[k, V]`` copy, k = 16). The rest,
   ``x_s``, is rounded per row to ``q = round(x_s / Δ)``, ``Δ = max|x_s| / L`` (``L`` = 127, or
   63 where fbgemm needs 7-bit activations): ``x̃ = Δ·q``, ``e = x_s − x̃``.
2. One call of fbgemm's int8 kernel (``quantized.linear_dynamic``) on the rows ``[q;
   sentinel]``: the sentinel row holds ``L + 1`` and ``−L``, so the kernel's dynamic activation
   quantization picks scale 1 and zero point ``L`` and the integer inputs pass through exactly
   (int8 × int8 summed in int32, times the weight row's scale; checked in the tests).
   ``approx = Δ·y + x_C·W_C``.
3. Per row and vocabulary entry ``o`` the error against the real-number logit ``x·W_o`` is
   bounded by ``|e·W_o| + |x̃·(W_o − W̃_o)| ≤ ‖e‖₂‖W_o‖₂ + min(‖x̃‖₁ max|ΔW_o|, ‖x̃‖₂‖ΔW_o‖₂)``
   (Cauchy–Schwarz and Hölder; ``e`` is computed, the per-row norms of ``W`` and
   ``ΔW = W − W̃`` are stored at load) plus float rounding: ``2γ·S_r·N_o`` with
   ``γ = γ_n = n·u/(1 − n·u)``, ``u = 2⁻²⁴``, ``n = D + k + 8``, ``S_r = ‖x‖₂ + ‖x̃‖₂``,
   ``N_o = ‖W_o‖₂ + ‖ΔW_o‖₂``. One ``γ`` is the full head's own error: an fp32 dot product
   of ``D`` terms summed in any order, whatever the kernel, is within
   ``γ_D Σ|x_i W_oi| ≤ γ_D‖x‖₂‖W_o‖₂`` of the real value (Higham, *Accuracy and Stability
   of Numerical Algorithms*, 2nd ed., §3.1); the other covers the screen's few roundings
   (int32 → fp32, two scalings, the ``k``-term addmm, ``e`` and ``ΔW`` as computed), within
   ``γ_{k+8}·S_r·N_o``. The whole is scaled by ``1 + 2γ`` (the norms are fp32 results too)
   and a margin of ``1e-4 + 1e-5·max|approx|`` is kept on top.
4. ``L_r = max_o (approx − bound)`` is a lower bound of the full head's fp32 logit at that
   ``o``; every ``o`` with ``approx + bound ≥ L_r`` is a candidate: a non-candidate's
   full-head logit is below ``L_r``. Each candidate's logit is computed in float64 (one
   gathered product per candidate), with ``Σ|x_i W_oi|``.
5. The full head may round a near tie between two candidates either way. A row is proven when
   one candidate's float64 logit less ``γ_D Σ|x_i W_oi|`` beats every other candidate's plus
   its own: the full head then ranks it first too. When any row is not proven (a near tie),
   or anything computed is not finite (inputs included), the whole step gets ``full(x)``:
   the very tensor the model computes without this head, so the argmax is the full head's
   bit for bit.

The returned row holds the candidates' logits (float64, rounded to fp32) and the approximations
elsewhere; every non-candidate entry is below ``L_r`` ≤ the best candidate, so ``argmax``
equals the full head's argmax, exactly (ties and near ties included, by step 5). This assumes
the full head computes IEEE fp32 dot products (no bf16 / tf32 "fast fp32" mode). Correctness
does not depend on which channels are split off, only the candidate count does.
Only the argmax is kept: ``CausalLM.forward(..., argmax_only=True)`` uses it for steps whose
every logits row is greedy without biases, penalties or processors
(``model_runner.argmax_suffices``); other steps get the full head. Measured on SmolLM2-135M
(``bench/screened_head_fallback.py``, 16 chats × 48 greedy tokens, 8 at a time): ~18
candidates per proven row in plain decode, ~14 in verify steps; the rows of steps that held a
near tie, given the full head: 3 % (plain) and 10 % (speculative; more rows per step), the
tokens identical to the full head's. The screen costs ~1/3 of the fp32 head at 8-24 rows
(``bench/verify_head.py``, measured before step 5 was added). CPU only (fbgemm); elsewhere the
full head runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from prefixgate.local_engine.model.quant.cpu_features import quantize_rows_int8

REFRESH_AT = (1, 8, 64, 512)  # calls after which the outlier channels are re-picked
UNIT_ROUNDOFF = 2.0 ** -24  # fp32


def gamma(n: int) -> float:
    """``γ_n = n·u / (1 − n·u)``: the relative error bound of an ``n``-term fp32 sum of
    products in any order (Higham, §3.1), ``u`` = :data:`UNIT_ROUNDOFF`."""
    nu = n * UNIT_ROUNDOFF
    if nu >= 0.5:
        raise ValueError("too many terms for an fp32 error bound")
    return nu / (1.0 - nu)


def available(weight: torch.Tensor) -> bool:
    """True where the int8 screen runs: fp32 weights on CPU with fbgemm's dynamic int8 linear."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and hasattr(torch.ops.quantized, "linear_dynamic")
            and "fbgemm" in torch.backends.quantized.supported_engines)


class ScreenedHead:
    """``__call__(x [R, D] fp32) -> [R, V] fp32`` whose per-row argmax is the fp32 head's.

    ``weight [V, D]``: the fp32 head matrix (kept by reference: for tied models the embedding
    table, which the model keeps anyway; rows are gathered from it for rescoring). ``full``: the
    model's own full-precision head (``x -> [R, V]``), run on the whole step where the screen
    proves nothing (module docstring, step 5). ``levels``: 127, or 63 on CPUs whose int8
    kernel needs 7-bit activations (fbgemm without VNNI: its 16-bit pair sums saturate);
    None: :func:`cpu_levels`, what this CPU needs. ``num_outliers``: input channels
    multiplied in fp32 (module docstring, step 1). Counters ``rows`` / ``full_rows`` /
    ``candidates``: rows screened and proven, rows given the full head (non-finite, or a step
    with a row not proven: module docstring, step 5), candidates rescored.
    Raises ``ValueError`` for a weight that is not fp32 ``[V, D]``.
    """

    def __init__(self, weight: torch.Tensor, full: Callable[[torch.Tensor], torch.Tensor],
                 levels: int | None = None, num_outliers: int = 16) -> None:
        levels = cpu_levels() if levels is None else levels
        w = weight.detach()
        if w.dtype != torch.float32 or w.dim() != 2:
            raise ValueError("ScreenedHead needs an fp32 [vocab, hidden] weight")
        self.weight, self.full, self.levels = w, full, levels
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        q = quantize_rows_int8(w, scale)
        self.packed = torch.ops.quantized.linear_prepack(q, None)
        delta = w - q.int_repr().float() * scale[:, None]
        self.w_l2 = w.norm(dim=1)                 # [V] ‖W_o‖₂
        self.d_l2 = delta.norm(dim=1)             # [V] ‖W_o − W̃_o‖₂
        self.d_inf = delta.abs().amax(dim=1)      # [V] max |W_o − W̃_o|
        self.n_l2 = self.w_l2 + self.d_l2          # [V] N_o (module docstring, step 3)
        self.reduce_range = levels < 127
        self.sentinel = torch.zeros(1, w.shape[1])
        self.sentinel[0, 0], self.sentinel[0, 1] = levels + 1, -levels
        self.rows = self.full_rows = self.candidates = self.calls = 0
        self.num_outliers = min(num_outliers, w.shape[1] - 1)
        self.chan_max = torch.zeros(w.shape[1])
        self.chans = torch.arange(self.num_outliers)
        self.w_chans = w[:, : self.num_outliers].t().contiguous()
        self.keep_mask = torch.ones(w.shape[1])
        self.keep_mask[: self.num_outliers] = 0.0
        self.gamma = gamma(w.shape[1] + self.num_outliers + 8)
        self.gamma_d = gamma(w.shape[1])

    def _outliers(self, x: torch.Tensor) -> None:
        """Track per-channel ``max |x|`` and (re)pick the ``num_outliers`` largest channels at
        the calls in ``REFRESH_AT`` (their weight columns are copied out, ``[k, V]``)."""
        self.calls += 1
        torch.maximum(self.chan_max, x.abs().amax(dim=0), out=self.chan_max)
        if self.calls in REFRESH_AT:
            self.chans = self.chan_max.topk(self.num_outliers).indices.sort().values
            self.w_chans = self.weight.index_select(1, self.chans).t().contiguous()
            self.keep_mask = torch.ones(self.weight.shape[1])
            self.keep_mask[self.chans] = 0.0

    def screen(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(approx [R, V], a [R, 1], b [R, 3])``: the estimate and the per-row factors of its
        error bound (``bound = (a·‖W_o‖₂ + min(b0·max|ΔW_o|, b1·‖ΔW_o‖₂) + 2γ·b2·N_o)(1 + 2γ)
        + margin``; ``b2 = S_r``, module docstring step 3)."""
        self._outliers(x)
        lv = float(self.levels)
        xs = x * self.keep_mask
        d = xs.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / lv
        q = torch.round(xs / d).clamp_(-lv, lv)
        r = x.shape[0]
        y = torch.ops.quantized.linear_dynamic(torch.cat([q, self.sentinel]), self.packed,
                                               self.reduce_range)
        approx = torch.addmm(y[:r] * d, x.index_select(1, self.chans), self.w_chans)
        xt = q * d
        a = (xs - xt).norm(dim=1, keepdim=True)
        xt_l2 = xt.norm(dim=1)
        b = torch.stack([xt.abs().sum(dim=1), xt_l2, x.norm(dim=1) + xt_l2], dim=1)
        return approx, a, b

    def bound(self, approx: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``[R, V]`` bound on ``|approx − x·Wᵀ|`` (real numbers) plus the full head's own fp32
        error at each entry (module docstring, step 3)."""
        k = 1.0 + 2.0 * self.gamma  # folded into the factors: no pass of its own over [R, V]
        out = torch.minimum((b[:, :1] * k) * self.d_inf, (b[:, 1:2] * k) * self.d_l2)
        out.addcmul_(a * k, self.w_l2)
        out.addcmul_(b[:, 2:] * (2.0 * self.gamma * k), self.n_l2)
        return out.add_(_margin(approx.abs().amax(dim=1, keepdim=True)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if xf.shape[0] == 0:  # a step whose prefill chunks end no prompt: no logits rows
            return xf.new_zeros(0, self.weight.shape[0])
        if not torch.isfinite(xf).all():
            return self._full(x)
        approx, a, b = self.screen(xf)
        bound = self.bound(approx, a, b)
        lower = (approx - bound).amax(dim=1, keepdim=True)  # [R, 1] ≤ the winner's logit
        if not bool(torch.isfinite(lower).all()):  # an overflow: nothing is proven
            return self._full(x)
        cand = (approx + bound).ge_(lower)                   # [R, V]
        row, col = cand.nonzero().unbind(dim=1)
        prod = self.weight.index_select(0, col).double().mul_(xf.index_select(0, row))
        value = prod.sum(dim=1)                 # the candidates' logits, float64 (finite:
        spread = prod.abs_().sum(dim=1)         # fp32 inputs) and Σ|x_i W_oi| of each
        if not self._proven(value, spread, row, approx.shape[0]):
            return self._full(x)
        self.rows += approx.shape[0]
        self.candidates += int(row.numel())
        approx.index_put_((row, col), value.float())
        return approx

    def _proven(self, value: torch.Tensor, spread: torch.Tensor, row: torch.Tensor,
                rows: int) -> bool:
        """True when in every row one candidate's float64 logit, less the full head's largest
        fp32 error there (``γ_D Σ|x_i W_oi|``), beats every other candidate's plus its error
        (module docstring, step 5): the full head then ranks that candidate first."""
        err = spread * (self.gamma_d * (1.0 + 1e-6))          # 1e-6: float64's own rounding
        lo, hi = value - err, value + err
        ninf = value.new_full((rows,), float("-inf"))
        best_lo = ninf.scatter_reduce(0, row, lo, "amax")
        at_best = lo == best_lo.index_select(0, row)
        ties = torch.zeros(rows, dtype=torch.float64).index_add_(0, row, at_best.double())
        other_hi = ninf.scatter_reduce(0, row, hi.masked_fill(at_best, float("-inf")), "amax")
        return bool(((best_lo > other_hi) & (ties == 1)).all())

    def _full(self, x: torch.Tensor) -> torch.Tensor:
        """The full head on every row of the step (what the model computes without this head)."""
        self.full_rows += x.shape[0]
        return self.full(x).float()


def _margin(v: torch.Tensor) -> torch.Tensor:
    """Float-rounding allowance for estimates ``v``: the kernel's fp32 rescaling and the
    two-level sum are exact to a few ulps of the magnitudes involved."""
    return 1e-4 + 1e-5 * v.abs()


def attach(model: Any, full: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Give ``model`` (a ``CausalLM``) an argmax head over its fp32 head matrix with ``full``
    as the exact fallback, where ``available``; returns whether it did. Call before the
    model's float head copy is dropped (the head matrix is kept by reference)."""
    w = model.head_weight()
    if not available(w):
        return False
    model._argmax_head = ScreenedHead(w, full, cpu_levels())
    return True


def cpu_levels() -> int:
    """Activation levels this CPU's int8 kernel computes exactly: 127 with VNNI, else 63 (a
    head built with 127 on an AVX2-only CPU screens with errors past its bound: seen here)."""
    from prefixgate.local_engine.model.quant.cpu_features import cpu_has_vnni as has

    return 127 if has() else 63
