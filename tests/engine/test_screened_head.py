"""The screened LM head: an int8 screen whose per-row argmax is provably the fp32 head's."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from prefixgate.local_engine.model.quant import screened_head
from prefixgate.local_engine.model.quant.screened_head import ScreenedHead
from prefixgate.local_engine.sched.api_types import SamplingParams

pytestmark = pytest.mark.skipif(not screened_head.available(torch.zeros(1, 1)),
                                reason="torch without fbgemm's dynamic int8 linear")


def _head(vocab: int = 3000, hidden: int = 64, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(vocab, hidden) * 0.05


def _hidden(rows: int, hidden: int = 64, seed: int = 1) -> torch.Tensor:
    """Rows with a few large channels, as a final RMSNorm's output has."""
    torch.manual_seed(seed)
    x = torch.randn(rows, hidden)
    x[:, 3] *= 40.0
    x[:, 17] *= 15.0
    return x


def _full(w: torch.Tensor) -> Any:
    return lambda x: F.linear(x, w)


def test_argmax_equals_the_full_heads_on_every_row() -> None:
    w, x = _head(), _hidden(200)
    head = ScreenedHead(w, _full(w))
    got = head(x)
    assert got.shape == (200, w.shape[0])
    assert torch.equal(got.argmax(dim=1), F.linear(x, w).argmax(dim=1))
    assert head.rows == 200 and head.full_rows == 0
    assert head.candidates < 200 * w.shape[0] // 20  # it screened: few rows rescored


def test_integer_rows_pass_the_int8_kernel_exactly_beside_the_sentinel() -> None:
    w = _head(vocab=300)
    head = ScreenedHead(w, _full(w))
    torch.manual_seed(9)
    lv = head.levels  # the CPU's: 127 with VNNI, 63 without (screened_head.cpu_levels)
    q = torch.randint(-lv, lv + 1, (5, 64)).float()
    y = torch.ops.quantized.linear_dynamic(torch.cat([q, head.sentinel]), head.packed,
                                           head.reduce_range)[:5]
    scale = w.abs().amax(dim=1) / 127.0
    wq = torch.round(w / scale[:, None])
    ref = (q.double() @ wq.double().T) * scale.double()
    assert float((y.double() - ref).abs().max()) < 1e-5 * float(ref.abs().max())


def test_the_error_bound_holds_for_every_entry() -> None:
    w, x = _head(seed=3), _hidden(64, seed=4)
    head = ScreenedHead(w, _full(w))
    head(x)  # picks the outlier channels
    approx, a, b = head.screen(x)
    err = (approx - F.linear(x, w)).abs()
    bound = head.bound(approx, a, b)
    assert bool((err <= bound).all())
    assert float((err / bound).max()) > 1e-3  # the bound is not vacuous zero-error slack


def test_near_ties_below_int8_resolution_are_decided_exactly() -> None:
    """A vocabulary of near-duplicate rows whose logits differ by less than int8's error: the
    int8 estimate alone picks another token on many rows; the screened head never does."""
    torch.manual_seed(5)
    base = torch.randn(64) * 0.05
    w = base + torch.randn(1500, 64) * 1e-4
    x = _hidden(60, seed=6)
    exact = F.linear(x, w)
    head = ScreenedHead(w, _full(w), num_outliers=2)
    got = head(x)
    approx, a, b = head.screen(x)
    assert int((approx.argmax(dim=1) != exact.argmax(dim=1)).sum()) >= 10  # int8 alone errs
    bound = head.bound(approx, a, b)  # every entry that might win was rescored exactly
    maybe = (approx + bound) >= (approx - bound).amax(dim=1, keepdim=True)
    assert torch.allclose(got[maybe], exact[maybe], atol=1e-5, rtol=0)
    assert torch.equal(got.argmax(dim=1), exact.argmax(dim=1))
    top = exact.argmax(dim=1, keepdim=True)  # the winner's entry holds its exact logit
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), atol=1e-5, rtol=0)


def test_non_finite_rows_use_the_full_head() -> None:
    w, x = _head(), _hidden(3)
    x[1, 0] = float("nan")
    head = ScreenedHead(w, _full(w))
    got = head(x)
    assert head.full_rows == 3
    assert torch.isnan(got[1]).all() and torch.equal(got[0].argmax(), F.linear(x, w)[0].argmax())


def test_no_rows_give_no_logits() -> None:
    w = _head(vocab=100)
    assert ScreenedHead(w, _full(w))(torch.zeros(0, 64)).shape == (0, 100)


def test_rejects_a_non_fp32_weight() -> None:
    with pytest.raises(ValueError, match="fp32"):
        ScreenedHead(torch.zeros(4, 4, dtype=torch.float64), lambda x: x)


def test_greedy_steps_use_the_argmax_head_and_others_the_full_head(make_engine: Any) -> None:
    eng = make_engine()
    assert eng.model._argmax_head is not None  # attached by cpu_linear.pack_model
    calls: list[int] = []
    inner = eng.model._argmax_head

    def spy(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return inner(x)

    eng.model._argmax_head = spy
    prompt = [[random.Random(1).randrange(100, 4000) for _ in range(12)]]
    eng.generate_batch(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(calls) == 4  # the prefill's last row + 3 decode steps
    for p in (SamplingParams(max_tokens=3, temperature=0.8, seed=1, ignore_eos=True),
              SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logit_bias={5: 1.0}),
              SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True,
                             repetition_penalty=1.3)):
        calls.clear()
        eng.generate_batch(prompt, p)
        assert calls == [], p


def test_engine_greedy_tokens_match_the_full_head(make_engine: Any) -> None:
    rng = random.Random(7)
    prompts = [[rng.randrange(100, 4000) for _ in range(rng.randint(3, 30))] for _ in range(6)]
    p = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    eng = make_engine()
    screened = eng.generate_batch(prompts, p)
    head = eng.model._argmax_head
    eng.model._argmax_head = None
    assert eng.generate_batch(prompts, p) == screened
    assert head.rows > 0
