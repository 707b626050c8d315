"""Speculative acceptance rules keep the target distribution (χ² on token frequencies).

Leviathan et al. 2023, Alg. 1: accept x ~ q with min(1, p(x)/q(x)), else sample norm(max(0, p−q)).
For a deterministic drafter (q = point mass on x) this is: accept with p(x), else sample p with x
removed and renormalised. Either way the emitted token is distributed as p.
"""

from __future__ import annotations

from collections import Counter

import torch

from prefixgate.local_engine.spec.decode import verify_greedy, verify_sampled
from prefixgate.local_engine.spec.drafters import Draft

# χ² critical value, 7 degrees of freedom, α = 0.001 (NIST/SEMATECH e-Handbook, table 1.3.6.7.4)
CHI2_7DF_999 = 24.322
N = 12000


def chi2(counts: Counter[int], p: torch.Tensor, n: int) -> float:
    exp = p * n
    return float(sum((counts.get(i, 0) - float(e)) ** 2 / float(e) for i, e in enumerate(exp)))


def first_tokens(probs: torch.Tensor, draft: Draft, seed: int) -> Counter[int]:
    gen = torch.Generator().manual_seed(seed)
    out: Counter[int] = Counter()
    for _ in range(N):
        accepted, nxt = verify_sampled(probs, draft, gen)
        out[(accepted + [nxt])[0]] += 1
    return out


P = torch.tensor([0.30, 0.05, 0.20, 0.10, 0.15, 0.05, 0.10, 0.05])


def test_deterministic_draft_keeps_p() -> None:
    probs = torch.stack([P, P.flip(0)])
    counts = first_tokens(probs, Draft([2]), seed=1)
    assert chi2(counts, P, N) < CHI2_7DF_999


def test_deterministic_draft_of_an_unlikely_token_keeps_p() -> None:
    probs = torch.stack([P, P])
    counts = first_tokens(probs, Draft([5]), seed=2)
    assert chi2(counts, P, N) < CHI2_7DF_999


def test_draft_model_rule_keeps_p_when_the_draft_is_sampled_from_q() -> None:
    q = torch.tensor([0.05, 0.30, 0.05, 0.20, 0.05, 0.15, 0.10, 0.10])
    gen = torch.Generator().manual_seed(3)
    probs = torch.stack([P, P])
    counts: Counter[int] = Counter()
    for _ in range(N):
        x = int(torch.multinomial(q, 1, generator=gen).item())
        accepted, nxt = verify_sampled(probs, Draft([x], q[None, :]), gen)
        counts[(accepted + [nxt])[0]] += 1
    assert chi2(counts, P, N) < CHI2_7DF_999


def test_wrong_rule_would_be_caught() -> None:
    """The test has power: always accepting the draft token is far from p."""
    counts = Counter({2: N})
    assert chi2(counts, P, N) > CHI2_7DF_999


def test_bonus_token_after_full_acceptance_comes_from_the_last_row() -> None:
    sure = torch.zeros(8)
    sure[4] = 1.0
    probs = torch.stack([sure, P])
    gen = torch.Generator().manual_seed(4)
    counts: Counter[int] = Counter()
    for _ in range(N):
        accepted, nxt = verify_sampled(probs, Draft([4]), gen)
        assert accepted == [4]  # p(x) = 1: always accepted
        counts[nxt] += 1
    assert chi2(counts, P, N) < CHI2_7DF_999


def test_greedy_accepts_the_argmax_prefix_and_corrects_the_first_miss() -> None:
    logits = torch.full((4, 10), -5.0)
    for row, tok in enumerate([3, 7, 1, 9]):
        logits[row, tok] = 5.0
    assert verify_greedy(logits, [3, 7, 2]) == ([3, 7], 1)
    assert verify_greedy(logits, [3, 7, 1]) == ([3, 7, 1], 9)
    assert verify_greedy(logits, [0, 7, 1]) == ([], 3)


def test_expected_tokens_follows_the_geometric_series() -> None:
    from prefixgate.local_engine.spec.decode import expected_tokens

    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 3) - (1 + 0.5 + 0.25 + 0.125)) < 1e-12


def test_k_cap_drafts_on_a_flat_curve_and_stops_on_a_steep_one() -> None:
    from prefixgate.local_engine.spec.decode import choose_k_cap

    flat = [(1, 50.0), (8, 60.0), (32, 90.0)]   # memory-bound: extra rows nearly free
    steep = [(1, 50.0), (2, 100.0), (8, 400.0)]  # compute-bound: cost grows with every row
    assert choose_k_cap([0.8], [6], flat, 6) == 6
    assert choose_k_cap([0.8], [6], steep, 6) == 0
    assert choose_k_cap([0.8] * 8, [6] * 8, flat, 6) >= 2
    assert choose_k_cap([0.05] * 8, [6] * 8, flat, 6) == 0  # nothing gets accepted: no drafts
    assert choose_k_cap([0.9, 0.9], [0, 0], flat, 6) == 0   # nobody may draft
