"""The screened LM head against inputs built to break it (:mod:`prefixgate.local_engine.model.quant.screened_head`).

Its promise: each row's argmax is the full head's, exactly. Two ways an unsound screen breaks
it, each built here on purpose:

- a near tie: two vocabulary rows whose logits are equal as real numbers (one is the other
  with channels of equal input swapped); the full head and the rescoring sum the products in
  different orders, so each may round the pair the other way;
- cancellation: a logit made of a huge fp32 outlier product cancelled by the int8 part, so
  the screen's float rounding is far above a margin scaled by the row's largest logit.

Every check is against the head the model would run instead (``F.linear`` and, where oneDNN
is present, ``cpu_linear.PackedLinear``), and the error bound against float64 arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.quant import cpu_linear, screened_head
from prefixgate.local_engine.model.quant.cpu_features import cpu_has_vnni
from prefixgate.local_engine.model.quant.screened_head import ScreenedHead

pytestmark = pytest.mark.skipif(
    not (hasattr(torch.ops.quantized, "linear_dynamic")
         and "fbgemm" in torch.backends.quantized.supported_engines),
    reason="torch without fbgemm's dynamic int8 linear")  # not available(): a test here checks it

Head = Callable[[torch.Tensor], torch.Tensor]
LEVELS = 127 if cpu_has_vnni() else 63
"""The activation levels :func:`screened_head.attach` gives this CPU: fbgemm's int8 kernel needs
7-bit activations without VNNI, where a head built with 127 levels is not what the engine runs
(its screen is then off by far more than its bound: seen on an AVX2-only box)."""


def _full_heads(w: torch.Tensor) -> list[Head]:
    heads: list[Head] = [lambda x: F.linear(x, w)]
    if cpu_linear.available(torch.device("cpu"), torch.float32):
        heads.append(cpu_linear.PackedLinear(w, None))
    return heads


def _swapped_pairs(seed: int, rows: int = 64, hidden: int = 576, vocab: int = 4000
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [rows, hidden], w [vocab, hidden])``: rows 0 and 1 of ``w`` both beat the rest and
    are equal as real numbers on every ``x`` row (channels 100..199 and 200..299 of ``x`` are
    equal; row 1 is row 0 with those channel blocks swapped)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g)
    x[:, 3] *= 40.0
    x[:, 200:300] = x[:, 100:200]
    w = torch.randn(vocab, hidden, generator=g) * 0.05
    w[0] = x.mean(0) / x.mean(0).norm() * 3.0 + torch.randn(hidden, generator=g) * 0.05
    w[1] = w[0]
    w[1, 100:200], w[1, 200:300] = w[0, 200:300], w[0, 100:200]
    return x, w


def test_near_ties_the_rescoring_orders_otherwise_get_the_full_heads_argmax() -> None:
    flips = 0
    for seed in range(6):
        x, w = _swapped_pairs(seed)
        rescored = (w[:2].unsqueeze(0) * x.unsqueeze(1)).sum(dim=2)  # the rescoring's order
        for full in _full_heads(w):
            want = full(x).argmax(dim=1)
            flips += int((rescored.argmax(dim=1) != want.clamp(max=1)).sum())
            head = ScreenedHead(w, full, LEVELS)
            assert torch.equal(head(x).argmax(dim=1), want)
    assert flips > 0  # the two orders do round the tie differently: the test can fail


def test_an_exact_tie_goes_to_the_full_head() -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 64)
    w = torch.randn(500, 64) * 0.05
    w[7] = x.mean(0) * 2.0
    w[9] = w[7]
    calls: list[int] = []

    def full(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.shape[0])
        return F.linear(t, w)

    head = ScreenedHead(w, full, LEVELS)
    got = head(x)
    assert calls == [4] and head.full_rows == 4 and head.rows == 0
    assert torch.equal(got, F.linear(x, w))


D, UNIT = 64, 127 * 4096 / 64  # an int8 channel's logit per weight integer (x = 127·4096)


def _cancelling(k: int, gap: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [1, 64], w [3, 64])``: row 1's logit is a ~1.5e7 outlier product (channel 0, fp32
    rounding ~0.5) cancelled by the int8 part down to a few thousand; row 0's logit is row 1's
    minus ``gap``, through a small outlier product. No quantization error anywhere (``x`` and
    ``w`` sit on their int8 grids), so only float rounding separates the screen from the truth."""
    x = torch.zeros(1, D)
    x[0, :16] = 2.0 ** 24  # the 16 outlier channels
    x[0, 0] = 15_000_000.0 + k * 1.0625
    x[0, 16:63] = 127 * 4096.0
    w = torch.zeros(3, D)
    w[:, 63] = 127 / 64  # x = 0 there: pins the rows' int8 scale at 1/64
    w[1, 0] = 65 / 64
    total, ints = -round(float(x[0, 0]) * 65 / 64 / UNIT), torch.zeros(47)
    for i in range(47):
        ints[i] = max(-127, min(127, total))
        total -= int(ints[i])
    assert total == 0
    w[1, 16:63] = ints / 64
    w[0, 63] = 127 * 2.0 ** -20  # row 0's grid: 2^-20
    w[0, 2] = 100 * 2.0 ** -20
    x[0, 2] = (float((x.double() @ w.double().T)[0, 1]) - gap) / float(w[0, 2])  # an outlier
    return x, w


@pytest.mark.parametrize("k", [7, 14, 21, 28, 35, 77, 154])
def test_the_bound_holds_under_cancellation(k: int) -> None:
    x, w = _cancelling(k)
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    head(x)  # picks the outlier channels
    approx, a, b = head.screen(x)
    truth = (x.double() @ w.double().T).float()
    assert bool(((approx - truth).abs() <= head.bound(approx, a, b)).all())


@pytest.mark.parametrize("k", [7, 14, 21, 28, 35, 77, 154])
def test_cancellation_gets_the_full_heads_argmax(k: int) -> None:
    x, w = _cancelling(k)
    for full in _full_heads(w):
        head = ScreenedHead(w, full, LEVELS)
        assert torch.equal(head(x).argmax(dim=1), full(x).argmax(dim=1))


def test_logits_past_fp32_range_get_the_full_head() -> None:
    torch.manual_seed(4)
    w = torch.randn(300, 64) * 0.05
    x = torch.randn(3, 64) * 1e38  # finite inputs, products past fp32's range
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    got = head(x)
    assert head.full_rows == 3
    assert torch.equal(got.nan_to_num(), F.linear(x, w).nan_to_num())


# --- the edges of the rules around the screen (issue 38) ---------------------------------------

def test_the_screen_is_available_for_fp32_cpu_weights_only() -> None:
    assert screened_head.available(torch.zeros(4, 4))
    for w in (torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, 4, dtype=torch.float16),
              torch.zeros(4, 4, device="meta")):
        assert not screened_head.available(w)


def test_a_step_without_logits_rows_gives_an_empty_answer_without_screening() -> None:
    w = torch.randn(50, 32)
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    out = head(torch.zeros(0, 32))
    assert out.shape == (0, 50) and out.dtype == torch.float32
    assert (head.calls, head.rows, head.full_rows) == (0, 0, 0)


def _two_candidates(head: ScreenedHead, v2: float, s1: float = 1.0, s2: float = 1.0) -> bool:
    value = torch.tensor([1.0, v2], dtype=torch.float64)
    spread = torch.tensor([s1, s2], dtype=torch.float64)
    return head._proven(value, spread, torch.tensor([0, 0]), 1)


def test_a_candidate_is_proven_only_past_both_rounding_allowances() -> None:
    """Two candidates of one row, each within ``γ_D Σ|x_i W_oi| (1 + 1e-6)`` of the full head's
    fp32 logit: the gap must exceed both allowances; a hair under (a relative 1e-6 of them) or
    a tie is not proven."""
    w = torch.randn(10, 64)
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    e = head.gamma_d * (1.0 + 1e-6)                 # the allowance of a candidate with spread 1
    assert _two_candidates(head, 1.0 - 2 * e * (1 + 1e-5))
    assert not _two_candidates(head, 1.0 - 2 * e * (1 - 1e-6))
    assert not _two_candidates(head, 1.0)           # a tie: never proven
    assert _two_candidates(head, 0.5) and _two_candidates(head, 1.5)   # either may be the best
    # the other candidate's high end exactly at the best's low end: not proven
    lo1 = torch.tensor(1.0, dtype=torch.float64) - torch.tensor(3.0, dtype=torch.float64) * e
    v2 = lo1 - e
    for _ in range(64):                             # nudge until v2 + its allowance == lo1 exactly
        hi2 = v2 + torch.tensor(1.0, dtype=torch.float64) * e
        if hi2 == lo1:
            break
        v2 = torch.nextafter(v2, lo1 if hi2 < lo1 else -lo1)
    assert v2 + e == lo1
    assert not _two_candidates(head, float(v2), s1=3.0)
    assert _two_candidates(head, float(torch.nextafter(v2, -lo1)) - 1e-15, s1=3.0)


def test_a_step_of_well_separated_rows_is_proven_and_counted() -> None:
    """No near tie: every row is proven, its candidates carry their float64 logits (rounded to
    fp32), every other entry sits below the row's best, and the counters add up over calls."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(3000, 96, generator=g) * 0.05
    x = torch.randn(6, 96, generator=g)
    for r in range(6):                                   # a clear winner per row
        w[100 + r] = x[r] / x[r].norm() * 2.0
    fulls: list[int] = []

    def full(t: torch.Tensor) -> torch.Tensor:
        fulls.append(t.shape[0])
        return F.linear(t, w)

    head = ScreenedHead(w, full, LEVELS)
    truth = (x.double() @ w.double().T)
    for call in (1, 2):
        out = head(x)
        assert fulls == [] and out.shape == (6, 3000)
        assert torch.equal(out.argmax(dim=1), torch.arange(100, 106))
        assert torch.equal(out.argmax(dim=1), F.linear(x, w).argmax(dim=1))
        assert (head.rows, head.full_rows) == (6 * call, 0)
        assert 6 * call <= head.candidates <= 6 * call * 40   # a few per row, counted each call
        assert torch.equal(out[torch.arange(6), torch.arange(100, 106)],
                           truth[torch.arange(6), torch.arange(100, 106)].float())
    head(torch.full((2, 96), float("nan")))              # a non-finite step: the full head
    head(torch.full((3, 96), float("inf")))
    assert fulls == [2, 3] and head.full_rows == 5 and head.rows == 12


@pytest.mark.parametrize("n", [1, 64, 576, 2 ** 22])
def test_gamma_is_n_u_over_one_minus_n_u(n: int) -> None:
    nu = n * 2.0 ** -24
    assert screened_head.gamma(n) == nu / (1.0 - nu)


def test_gamma_refuses_half_the_precision_or_more() -> None:
    assert screened_head.gamma(2 ** 23 - 1) > 0
    for n in (2 ** 23, 2 ** 24):
        with pytest.raises(ValueError, match="^too many terms for an fp32 error bound$"):
            screened_head.gamma(n)


def test_the_head_takes_an_fp32_matrix_and_its_documented_defaults() -> None:
    w = torch.randn(40, 32)
    head = ScreenedHead(w, lambda t: F.linear(t, w))
    assert (head.levels, head.num_outliers, head.reduce_range) == (LEVELS, 16, LEVELS < 127)
    assert screened_head.cpu_levels() == LEVELS
    assert ScreenedHead(w, lambda t: t, 127).reduce_range is False
    assert ScreenedHead(w, lambda t: t, 63, num_outliers=40).num_outliers == 31   # at most D - 1
    for levels in (63, 127):                                   # a width asked for is the width used
        asked = ScreenedHead(w, lambda t: t, levels)
        assert (asked.levels, asked.reduce_range) == (levels, levels < 127)
    for bad in (w.double(), w[0], w.unsqueeze(0)):
        with pytest.raises(ValueError, match=r"^ScreenedHead needs an fp32 \[vocab, hidden\] weight$"):
            ScreenedHead(bad, lambda t: t)


# --- the numbers the proof rests on, each against its own float64 reference (issue 38) ------
# A looser bound than the docstring's keeps every argmax right (more candidates are rescored),
# so the argmax tests above cannot see it; these pin each factor of the bound to the formula.

def _reference_weight_norms(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """``‖W_o‖₂``, ``‖ΔW_o‖₂``, ``max|ΔW_o|`` in float64, ``W̃`` the per-row int8 grid at
    ``max|W_o| / 127`` (round half to even, as ``quantize_per_channel``)."""
    wd = w.double()
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
    delta = wd - torch.round(wd / scale[:, None]).clamp(-128, 127) * scale[:, None]
    return {"w_l2": wd.norm(dim=1), "d_l2": delta.norm(dim=1), "d_inf": delta.abs().amax(dim=1)}


def _weights(seed: int, vocab: int = 700, hidden: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, hidden, generator=g) * 0.05
    w[5] = 0.0                                           # a zero row: scale clamped, ΔW = 0
    w[6] = torch.randint(-127, 128, (hidden,), generator=g).float() / 64   # on its int8 grid:
    w[6, 0] = 127 / 64                                   # its largest weight sets the scale 1/64
    w[7, 3] = 4.0                                        # one large weight: coarse grid
    return w


@pytest.mark.parametrize("seed", [0, 1])
def test_the_stored_weight_norms_are_the_documented_ones(seed: int) -> None:
    w = _weights(seed)
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    ref = _reference_weight_norms(w)
    for name in ("w_l2", "d_l2", "d_inf"):
        assert torch.allclose(getattr(head, name).double(), ref[name], rtol=1e-5, atol=1e-9), name
    assert torch.allclose(head.n_l2.double(), ref["w_l2"] + ref["d_l2"], rtol=1e-5, atol=1e-9)
    assert float(head.d_l2[5]) == 0.0 and float(head.d_l2[6]) == 0.0
    assert float(head.d_inf[7]) > 4.0 / 127 / 4          # the large weight's row: coarse grid
    assert head.gamma == screened_head.gamma(96 + 16 + 8)
    assert head.gamma_d == screened_head.gamma(96)
    assert (head.rows, head.full_rows, head.candidates, head.calls) == (0, 0, 0, 0)


EXACT_LEVELS = [63] + ([127] if cpu_has_vnni() else [])
"""Activation widths whose int8 kernel is exact on this CPU: 7-bit everywhere (``reduce_range``),
8-bit only with VNNI. Both are run where both are exact, so a screen that ignores the width it was
built for fails on either kind of CPU."""


def _x(seed: int, rows: int = 5, hidden: int = 96, sign: str = "mixed") -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(rows, hidden, generator=g)
    if sign == "positive":             # no int8 input at -L: only the sentinel's -L sets the range
        x = x.abs()
    x[:, 11] *= 60.0                   # outlier channels, as RMSNorm's output
    x[:, 40] *= 30.0
    x[rows - 1] *= 0.01                # a quiet row: its step Δ is far below 1
    return x


@pytest.mark.parametrize("levels", EXACT_LEVELS)
@pytest.mark.parametrize("sign", ["mixed", "positive"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_screen_returns_the_documented_estimate_and_bound_factors(seed: int, sign: str,
                                                                      levels: int) -> None:
    """``approx = Δ·(q·W̃ᵀ) + x_C·W_Cᵀ`` (the int8 kernel exact on the integers, through the
    sentinel row), ``a = ‖e‖₂``, ``b = (‖x̃‖₁, ‖x̃‖₂, ‖x‖₂ + ‖x̃‖₂)``, all per row, with
    ``Δ = max|x_s| / L`` (module docstring, steps 1-3)."""
    w, x = _weights(seed), _x(seed, sign=sign)
    head = ScreenedHead(w, lambda t: F.linear(t, w), levels)
    approx, a, b = head.screen(x)
    chans = head.chans
    keep = torch.ones(96, dtype=torch.bool)
    keep[chans] = False
    xs = torch.where(keep, x, torch.zeros_like(x))
    d = xs.abs().amax(dim=1, keepdim=True) / levels
    q = torch.round(xs / d).clamp(-levels, levels)
    xt = (q * d).double()
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
    w_int = torch.round(w.double() / scale[:, None]).clamp(-128, 127)
    want = d.double() * (q.double() @ w_int.t()) * scale + x[:, chans].double() @ w[:, chans].double().t()
    assert torch.allclose(approx.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(a.double(), (xs.double() - xt).norm(dim=1, keepdim=True), rtol=1e-5)
    want_b = torch.stack([xt.abs().sum(dim=1), xt.norm(dim=1),
                          x.double().norm(dim=1) + xt.norm(dim=1)], dim=1)
    assert torch.allclose(b.double(), want_b, rtol=1e-5)
    assert approx.shape == (5, 700) and a.shape == (5, 1) and b.shape == (5, 3)
    truth = x.double() @ w.double().t()
    assert bool(((approx.double() - truth).abs() <= head.bound(approx, a, b).double()).all())


def test_each_rows_rounding_allowance_is_its_own() -> None:
    """Step 5's allowance ``γ_D Σ|x_i W_oi|`` is per candidate: a loud row (inputs 10⁴ times
    larger) in the same step does not widen a quiet row's, so a quiet row whose best beats the
    runner-up by 1e-3 is proven beside it (a step-wide sum would send the step to the full head)."""
    g = torch.Generator().manual_seed(21)
    w = torch.randn(500, 96, generator=g) * 0.05
    x = torch.randn(2, 96, generator=g)
    x[1] *= 1e4
    u0 = x[0] / x[0].norm()
    w[10] = u0 * 2.0
    w[11] = w[10] - u0 * (1e-3 / float(x[0].norm()))   # row 0: best 10, runner-up 11 at 1e-3
    w[20] = x[1] / x[1].norm() * 2.0                   # row 1: a clear best
    fulls: list[int] = []

    def full(t: torch.Tensor) -> torch.Tensor:
        fulls.append(t.shape[0])
        return F.linear(t, w)

    head = ScreenedHead(w, full, LEVELS)
    out = head(x)
    assert fulls == [] and (head.rows, head.full_rows) == (2, 0)
    assert out.argmax(dim=1).tolist() == [10, 20] == F.linear(x, w).argmax(dim=1).tolist()


@pytest.mark.parametrize("a0,b0,b1,b2", [
    (3.0, 0.0, 0.0, 0.0),        # the activation rounding term alone
    (0.0, 2.0, 1e6, 0.0),        # min() takes the ‖x̃‖₁·max|ΔW| side
    (0.0, 1e6, 2.0, 0.0),        # min() takes the ‖x̃‖₂·‖ΔW‖₂ side
    (0.0, 0.0, 0.0, 5e3),        # the float-rounding term alone
    (0.0, 0.0, 0.0, 0.0),        # the margin alone
    (1.5, 2.0, 3.0, 40.0),       # all together
])
def test_the_bound_is_the_documented_formula(a0: float, b0: float, b1: float, b2: float) -> None:
    """``bound = (a‖W_o‖ + min(b0·max|ΔW_o|, b1·‖ΔW_o‖) + 2γ·b2·N_o)(1 + 2γ)
    + 1e-4 + 1e-5·max_o|approx|`` (module docstring, step 3), each term made to dominate in turn."""
    w = torch.randn(300, 576, generator=torch.Generator().manual_seed(3)) * 0.05
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS)
    approx = torch.linspace(-900.0, 700.0, 300).repeat(2, 1)
    approx[1] *= 0.25
    a = torch.tensor([[a0], [a0 * 2]])
    b = torch.tensor([[b0, b1, b2], [b0 * 2, b1 * 2, b2 * 2]])
    got = head.bound(approx.clone(), a, b).double()
    g = screened_head.gamma(576 + 16 + 8)
    ad, bd = a.double(), b.double()
    wl2, dl2, dinf = head.w_l2.double(), head.d_l2.double(), head.d_inf.double()
    terms = ad * wl2 + torch.minimum(bd[:, :1] * dinf, bd[:, 1:2] * dl2) \
        + 2 * g * bd[:, 2:] * (wl2 + dl2)
    margin = 1e-4 + 1e-5 * approx.double().abs().amax(dim=1, keepdim=True)
    want = terms * (1 + 2 * g) + margin
    assert torch.allclose(got, want, rtol=2e-6, atol=0.0)
    # the (1 + 2γ) factor is ~7e-5 of the terms: the comparison above sees it
    assert not torch.allclose(got, terms + margin, rtol=2e-6, atol=0.0) or bool((terms == 0).all())


def test_the_outlier_channels_are_re_picked_only_at_the_documented_calls() -> None:
    """Channels split off in fp32: the largest ``max|x|`` seen so far, re-picked after the calls
    in ``REFRESH_AT`` (1, 8, 64, 512) and kept in between; the kept mask and the ``[k, V]``
    weight copy follow them."""
    w = _weights(0)
    head = ScreenedHead(w, lambda t: F.linear(t, w), LEVELS, num_outliers=3)
    base = torch.ones(2, 96) * 0.01
    picks: dict[int, list[int]] = {}
    for call in range(1, 66):
        x = base.clone()
        x[0, 10], x[1, 20], x[0, 30] = 5.0, 6.0, 7.0              # the first three, from call 1
        if call >= 2:
            x[1, 50] = 100.0 + call                                # larger, seen from call 2
        if call >= 9:
            x[0, 60] = 1000.0                                      # seen from call 9
        head.screen(x)
        picks[call] = head.chans.tolist()
        assert head.calls == call
        assert torch.equal(head.w_chans, w[:, head.chans].t().contiguous())
        mask = torch.ones(96)
        mask[head.chans] = 0.0
        assert torch.equal(head.keep_mask, mask)
    assert all(picks[c] == [10, 20, 30] for c in range(1, 8))
    assert all(picks[c] == [20, 30, 50] for c in range(8, 64))
    assert picks[64] == picks[65] == [30, 50, 60]
    assert float(head.chan_max[50]) == 100.0 + 65 and float(head.chan_max[60]) == 1000.0
    assert screened_head.REFRESH_AT == (1, 8, 64, 512)


class _Model:
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w
        self._argmax_head = None

    def head_weight(self) -> torch.Tensor:
        return self.w


def test_attach_gives_a_cpu_fp32_model_a_screened_head_over_its_own_matrix() -> None:
    w = torch.randn(200, 64)
    model = _Model(w)

    def full(t: torch.Tensor) -> torch.Tensor:
        return F.linear(t, w)

    assert screened_head.attach(model, full) is True
    head = model._argmax_head
    assert isinstance(head, ScreenedHead)
    assert head.weight.data_ptr() == w.data_ptr() and head.full is full
    assert head.levels == screened_head.cpu_levels() and head.num_outliers == 16
    x = torch.randn(3, 64)
    assert torch.equal(head(x).argmax(dim=1), F.linear(x, w).argmax(dim=1))
    for other in (w.double(), w.half()):
        plain = _Model(other)
        assert screened_head.attach(plain, full) is False
        assert plain._argmax_head is None


@pytest.mark.parametrize("vnni,levels", [(True, 127), (False, 63)])
def test_cpu_levels_follow_the_cpus_int8_dot_products(monkeypatch: pytest.MonkeyPatch,
                                                       vnni: bool, levels: int) -> None:
    from prefixgate.local_engine.model.quant import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_has_vnni", lambda: vnni)
    assert screened_head.cpu_levels() == levels
    w = torch.randn(30, 32)
    assert screened_head.attach(_Model(w), lambda t: t) is True


def test_the_full_head_fallback_counts_its_rows_and_returns_fp32() -> None:
    w = torch.randn(40, 32)
    head = ScreenedHead(w, lambda t: F.linear(t.double(), w.double()), LEVELS)
    out = head._full(torch.randn(3, 32))
    assert out.dtype == torch.float32 and out.shape == (3, 40) and head.full_rows == 3
    head._full(torch.randn(2, 32))
    assert head.full_rows == 5
