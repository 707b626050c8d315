"""``bench/teacher_forced.py``: KL(ref || other), top-1 agreement and NLL delta over an answer,
and their means over requests (issue 36: the figures of ``bench/answer_stability.py``)."""

from __future__ import annotations

import bisect
import math
from typing import Any

import pytest
import torch

from bench.teacher_forced import IDENTICAL, compare, kl_rows, summary


class Rows:
    """A stand-in for the engine's ``PromptLogprobs``: rows by position."""

    def __init__(self, positions: list[int], probs: list[list[float]]) -> None:
        self.positions = positions
        self.rows = torch.tensor(probs, dtype=torch.float64).log().to(torch.float32)

    def row(self, pos: int) -> Any:
        i = bisect.bisect_left(self.positions, pos)
        return self.rows[i] if i < len(self.positions) and self.positions[i] == pos else None


P = [[0.7, 0.2, 0.1], [0.02, 0.96, 0.02]]
Q = [[0.45, 0.35, 0.2], [0.3, 0.3, 0.4]]
ANSWER = [0, 1]  # the reference's greedy tokens: the argmax of each row of P


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def test_identical_rows_give_kl_zero_top1_one_and_no_nll_delta() -> None:
    got = compare(Rows([9, 10], P), Rows([9, 10], P), [9, 10], [9, 10], ANSWER)
    assert got["kl_mean"] == pytest.approx(0.0, abs=1e-9) and got["kl_max"] == pytest.approx(0.0, abs=1e-9)
    assert got["top1"] == 1.0 and got["nll_delta"] == pytest.approx(0.0, abs=1e-9)
    assert (got["positions"], got["missing"]) == (2, 0)


def test_a_known_pair_of_distributions_gives_kl_of_the_reference_over_the_other() -> None:
    """KL(P || Q) by hand, per position; top-1 of Q against the answer (position 0: argmax 0,
    agreeing; position 1: argmax 2, not 1); NLL delta: mean of log p(a) - log q(a)."""
    got = compare(Rows([9, 10], P), Rows([19, 20], Q), [9, 10], [19, 20], ANSWER)
    k0, k1 = _kl(P[0], Q[0]), _kl(P[1], Q[1])
    assert got["kl_mean"] == pytest.approx((k0 + k1) / 2, rel=1e-5)
    assert got["kl_max"] == pytest.approx(max(k0, k1), rel=1e-5)
    assert got["top1"] == 0.5
    nll = (math.log(0.7 / 0.45) + math.log(0.96 / 0.3)) / 2
    assert got["nll_delta"] == pytest.approx(nll, rel=1e-5)


def test_the_direction_is_reference_first_not_the_swapped_kl() -> None:
    """KL is not symmetric: on this pair KL(Q || P) differs from KL(P || Q) by far more than
    the tolerance, so a swapped argument order fails here."""
    want = (_kl(P[0], Q[0]) + _kl(P[1], Q[1])) / 2
    swapped = (_kl(Q[0], P[0]) + _kl(Q[1], P[1])) / 2
    assert abs(want - swapped) > 0.05
    got = compare(Rows([9, 10], P), Rows([9, 10], Q), [9, 10], [9, 10], ANSWER)["kl_mean"]
    assert got == pytest.approx(want, rel=1e-5) and got != pytest.approx(swapped, rel=1e-2)
    assert kl_rows(Rows([0, 1], P).rows, Rows([0, 1], Q).rows) == pytest.approx(
        [_kl(P[0], Q[0]), _kl(P[1], Q[1])], rel=1e-5)


def test_a_position_missing_on_either_side_is_left_out_and_counted() -> None:
    got = compare(Rows([9, 10], P), Rows([20], Q[1:]), [9, 10], [19, 20], ANSWER)
    assert (got["positions"], got["missing"]) == (1, 1)
    assert got["kl_mean"] == pytest.approx(_kl(P[1], Q[1]), rel=1e-5) and got["top1"] == 0.0
    none = compare(Rows([9, 10], P), None, [9, 10], [19, 20], ANSWER)
    assert none["kl_mean"] is None and none["missing"] == 2


def test_the_summary_is_the_mean_of_the_per_request_means() -> None:
    """Each request weighs the same, whatever its answer's length; requests without figures
    are skipped but their missing positions counted."""
    rows = [{"kl_mean": 0.1, "top1": 1.0, "nll_delta": 0.2, "missing": 0},
            {"kl_mean": 0.3, "top1": 0.5, "nll_delta": -0.1, "missing": 1},
            {"kl_mean": None, "top1": None, "nll_delta": None, "missing": 24},
            dict(IDENTICAL, missing=0)]
    got = summary(rows)
    assert got["kl_mean"] == pytest.approx(0.4 / 3, abs=1e-6)
    assert got["top1_agreement"] == pytest.approx(2.5 / 3, abs=1e-6)
    assert got["nll_delta"] == pytest.approx(0.1 / 3, abs=1e-6)
    assert (got["requests"], got["missing_positions"]) == (3, 25)
    assert summary([])["kl_mean"] is None
