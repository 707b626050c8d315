"""Sampled verification, point by point and fast (issue 21): the χ² tests of
``test_spec_verify`` hold the distribution; these pin each step of the rule with outcomes that
are certain (probabilities 0 or 1) or frequencies far from any broken rule's.

Rule (Leviathan et al. 2023, Alg. 1; ``spec.decode`` module docstring): accept draft token ``x``
at row ``i`` with probability ``min(1, p_i(x) / q_i(x))`` (``p_i(x)`` for a deterministic
drafter); at the first rejection sample from ``normalise(max(0, p_i − q_i))`` (``p_i`` without
``x`` for a deterministic drafter) and stop; after a fully accepted draft draw the bonus token
from row ``k``. Uniforms and draws come from the request's generator only.
"""

from __future__ import annotations

import torch

from prefixgate.local_engine.spec.decode import verify_sampled
from prefixgate.local_engine.spec.drafters import Draft

V = 6
N = 1000  # acceptance frequencies: binomial sd <= 0.016, every bound below is >= 3.5 sd wide


def point(tok: int) -> torch.Tensor:
    out = torch.zeros(V)
    out[tok] = 1.0
    return out


def dist(**mass: float) -> torch.Tensor:
    out = torch.zeros(V)
    for k, v in mass.items():
        out[int(k[1:])] = v
    return out


def test_certain_tokens_are_accepted_and_the_bonus_comes_from_row_k() -> None:
    gen = torch.Generator().manual_seed(0)
    probs = torch.stack([point(2), point(4), point(1), point(5)])
    for _ in range(20):
        assert verify_sampled(probs, Draft([2, 4, 1]), gen) == ([2, 4, 1], 5)
        assert verify_sampled(probs, Draft([2, 4]), gen) == ([2, 4], 1)


def test_an_impossible_token_stops_the_draft_there_and_the_row_decides() -> None:
    gen = torch.Generator().manual_seed(1)
    probs = torch.stack([point(2), point(3), point(0)])
    for _ in range(20):
        assert verify_sampled(probs, Draft([2, 5]), gen) == ([2], 3)
        assert verify_sampled(probs, Draft([1, 3]), gen) == ([], 2)


def test_deterministic_draft_accepted_with_p_and_never_redrawn_after_rejection() -> None:
    gen = torch.Generator().manual_seed(2)
    probs = torch.stack([dist(t1=0.3, t4=0.7), point(0)])
    accepted = 0
    for _ in range(N):
        got, nxt = verify_sampled(probs, Draft([1]), gen)
        if got:
            accepted += 1
            assert nxt == 0
        else:
            assert nxt == 4  # x removed: the only other token with mass
    assert 0.25 < accepted / N < 0.35


def test_draft_model_accepted_with_p_over_q_and_resampled_from_the_residual() -> None:
    gen = torch.Generator().manual_seed(3)
    p = dist(t0=0.6, t1=0.4)
    q = dist(t0=0.2, t1=0.8)
    probs = torch.stack([p, point(5)])
    accepted = 0
    for _ in range(N):
        got, nxt = verify_sampled(probs, Draft([1], q[None, :]), gen)
        if got:
            accepted += 1
            assert nxt == 5
        else:
            assert nxt == 0  # max(0, p − q) has mass on token 0 only
    assert 0.44 < accepted / N < 0.56  # min(1, 0.4 / 0.8)
    # q above p nowhere on x: accepted every time (ratio capped at 1), even where q(x) is 0
    for qx in (dist(t1=0.2, t2=0.8), dist(t2=1.0)):
        assert verify_sampled(probs, Draft([1], qx[None, :]), gen) == ([1], 5)


def test_the_requests_generator_alone_decides() -> None:
    probs = torch.stack([dist(t1=0.5, t2=0.5), dist(t1=0.5, t3=0.5), dist(t0=0.5, t4=0.5)])
    q = torch.stack([dist(t1=0.9, t2=0.1), dist(t1=0.1, t3=0.9)])

    def run(seed: int, noise: int) -> list[tuple[list[int], int]]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for i in range(40):
            torch.manual_seed(noise + i)  # the global generator must not matter
            out.append(verify_sampled(probs, Draft([1, 3]), gen))
            out.append(verify_sampled(probs, Draft([1, 3], q), gen))
        return out

    assert run(7, 0) == run(7, 1000)
    assert run(7, 0) != run(8, 0)
