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
    for bad in (w.double(), w[0], w.unsqueeze(0)):
        with pytest.raises(ValueError, match=r"^ScreenedHead needs an fp32 \[vocab, hidden\] weight$"):
            ScreenedHead(bad, lambda t: t)
