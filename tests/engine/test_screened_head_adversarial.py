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

pytestmark = pytest.mark.skipif(not screened_head.available(torch.zeros(1, 1)),
                                reason="torch without fbgemm's dynamic int8 linear")

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
