"""The meaning guard's test: does a move change answers more than the backend's own floor?

Each trial pair sends one request three times at temperature 0 — the original, the original
again (the floor: the backend's own nondeterminism), the variant with the move on — and records
two booleans: ``move_changed`` (variant vs original) and ``floor_changed`` (repeat vs original).
Over ``n`` pairs, with ``b`` = pairs where only the move changed the answer and ``c`` = pairs
where only the floor did, the quantity judged is the paired difference

    d = P(move changed) - P(floor changed) = p_b - p_c   (estimate (b - c) / n).

**The rule** (:func:`decide`), a group-sequential test with a look every ``look_every`` pairs up
to ``max_pairs`` (``K = ceil(max_pairs / look_every)`` looks; ``alpha = 1 - confidence``):

- **on** (the move is proven harmless) when the non-inferiority test of ``H0: d >= margin``
  rejects: Tango's score statistic ``T(margin) < -z_on``, i.e. the score interval's upper bound
  on ``d`` is below ``margin``. Its alpha is spent Haybittle-Peto style: each interim look spends
  ``alpha / max(50, 4 (K - 1))`` (0.001 for the defaults) and the last look the rest (0.041).
- **off** (the move is proven worse) when the superiority test of ``H0: d <= 0`` rejects,
  ``T(0) > z_off`` (McNemar's statistic ``(b - c) / sqrt(b + c)``; the score interval's lower
  bound above 0), AND the estimate is above ``margin / 2`` (nearer the margin than the floor: a
  move only slightly worse than the floor keeps trialling and may still be proven "on"). Its
  alpha is spent equally, ``alpha / K`` per look (z = 2.576 for the defaults), so a move that
  changes most answers is turned off at the first look.
- "on" is checked first; between looks the state is "trialling" (never a verdict before the
  first look). At ``max_pairs`` a move neither on nor off is **off**, reason ``not proven within
  N pairs``: the guard fails closed.

Each test's alpha summed over the looks is at most ``1 - confidence`` (the Bonferroni
inequality, valid however the looks correlate), so a move with ``d >= margin`` is turned on, and
one with ``d <= 0`` turned off, with probability at most ``1 - confidence`` (up to the normal
approximation of the score statistic).

**Sources.** Tango's score test and interval for a difference of paired proportions: T. Tango
(1998), "Equivalence test and confidence interval for the difference in proportions for the
paired-sample design", Statistics in Medicine 17:891-908 (statistic and restricted MLE as in
Fagerland, Lydersen & Laake (2017), *Statistical Analysis of Contingency Tables*, ch. 8). The
interim boundary: J. L. Haybittle (1971), Br. J. Radiology 44:793-797; R. Peto et al. (1976),
Br. J. Cancer 34:585-612, here made exact by the Bonferroni sum.

**Why not the simpler rule** (Agresti & Min (2005) adjusted Wald interval, Stat. Med. 24:729,
with alpha / K at every look), measured exactly by dynamic programming over the pair counts and
again by simulation (``bench/guard_sequential.py``, ``bench/results/guard_sequential.json``):
(1) with a floor of 0 and a move changing exactly ``margin`` = 15 % of answers, it turns the move
on 6.1 % of the time (> 5 %: the adjusted Wald interval is too narrow at zero cells; Tango's
score test: 0.1 %); (2) on a backend that flips each answer with p = 0.25 at temperature 0
whatever the move (d = 0, both changed rates 0.375), alpha / K leaves the last look at z = 2.58
and only 86 % of trials reach "on" within 200 pairs (the rest fail closed to "off"); spending the
on-test's alpha late reaches 95 % (2 % proven "off", 3 % not proven), near the 96.5 % that a
single test at 200 pairs and one-sided 5 % reaches (about the most a 5 % test can with 200
pairs). The price: a move that changes nothing is turned on at 60 pairs, not at 20 (Agresti-Min)
or 40 (Tango with alpha / K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

State = Literal["trialling", "on", "off"]

_ND = NormalDist()
_BISECT_STEPS = 60


@dataclass(frozen=True)
class PairCounts:
    """Trial pairs so far: ``pairs`` sent; ``move_changed`` / ``floor_changed``: pairs whose
    variant / repeat answer differed from the original; ``both_changed``: pairs where both did."""

    pairs: int
    move_changed: int
    floor_changed: int
    both_changed: int


@dataclass(frozen=True)
class TestRule:
    """The test's settings (module docstring): ``margin``: the changed-rate excess over the
    floor tolerated (0..1); ``confidence``: 1 - each test's total alpha; a look every
    ``look_every`` pairs up to ``max_pairs``."""

    __test__ = False  # a dataclass named Test*, not a pytest class

    margin: float = 0.15
    confidence: float = 0.95
    look_every: int = 20
    max_pairs: int = 200

    def __post_init__(self) -> None:
        if not 0.0 < self.margin < 1.0:
            raise ValueError(f"margin must be in (0, 1), got {self.margin}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.look_every < 1 or self.max_pairs < self.look_every:
            raise ValueError(f"need 1 <= look_every <= max_pairs, got {self.look_every}, {self.max_pairs}")

    @property
    def looks(self) -> int:
        """K, the number of looks."""
        return math.ceil(self.max_pairs / self.look_every)


@dataclass(frozen=True)
class Decision:
    """:func:`decide`'s answer: the ``state``; ``move_rate`` / ``floor_rate``: changed rates;
    ``upper`` / ``lower``: the score interval's bounds on d at this look's on / off levels
    (1 / -1 where no look is taken: before the first and between looks); ``reason``: one line
    for people."""

    state: State
    pairs: int
    move_rate: float
    floor_rate: float
    upper: float
    lower: float
    reason: str


def look_alphas(rule: TestRule, look: int) -> tuple[float, float]:
    """``(alpha_on, alpha_off)`` spent at look ``look`` (1..K): Haybittle-Peto for "on" (small
    at interim looks, the rest at the last), equal ``alpha / K`` for "off" (module docstring)."""
    alpha, k = 1.0 - rule.confidence, rule.looks
    interim = alpha / max(50, 4 * (k - 1))
    alpha_on = alpha - (k - 1) * interim if look >= k else interim
    return alpha_on, alpha / k


def tango_statistic(n: int, b: int, c: int, delta0: float) -> float:
    """Tango's score statistic for ``H0: p_b - p_c = delta0`` over ``n`` pairs with ``b`` / ``c``
    discordant pairs of each kind: ``(b - c - n delta0) / sqrt(n (2 p_c~ + delta0 (1 - delta0)))``
    with ``p_c~`` the MLE of ``p_c`` restricted to ``delta0`` (Tango 1998). Increasing in ``b``
    and decreasing in ``delta0``; 0 when ``b = c = 0`` and ``delta0 = 0`` (no evidence)."""
    a_ = 2.0 * n
    b_ = -b - c + (2.0 * n - b + c) * delta0
    c_ = -c * delta0 * (1.0 - delta0)
    p_c = (math.sqrt(max(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (2.0 * a_)
    var = n * (2.0 * p_c + delta0 * (1.0 - delta0))
    num = b - c - n * delta0
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def score_bound(n: int, b: int, c: int, z: float, upper: bool) -> float:
    """The score interval's upper (``T(delta) = -z``) or lower (``T(delta) = z``) bound on d,
    by bisection over (-1, 1)."""
    target = -z if upper else z
    lo, hi = -1.0, 1.0
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2.0
        if tango_statistic(n, b, c, mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def _discordant(c: PairCounts) -> tuple[int, int]:
    move_only, floor_only = c.move_changed - c.both_changed, c.floor_changed - c.both_changed
    if min(c.pairs, c.both_changed, move_only, floor_only) < 0 or \
            move_only + floor_only + c.both_changed > c.pairs:
        raise ValueError(f"inconsistent pair counts: {c}")
    return move_only, floor_only


def decide(c: PairCounts, rule: TestRule) -> Decision:
    """The verdict for counts ``c`` under ``rule`` (module docstring states the rule). Only at a
    look (``pairs`` a multiple of ``look_every``, or ``pairs >= max_pairs``) can the state be
    other than "trialling". Raises ValueError on inconsistent counts."""
    b, f = _discordant(c)
    n = c.pairs
    move_rate = c.move_changed / n if n else 0.0
    floor_rate = c.floor_changed / n if n else 0.0
    final = n >= rule.max_pairs
    if n == 0 or (n % rule.look_every and not final):
        nxt = min(rule.max_pairs, (n // rule.look_every + 1) * rule.look_every)
        return Decision("trialling", n, move_rate, floor_rate, 1.0, -1.0,
                        f"{n} pairs; next look at {nxt}")
    look = rule.looks if final else n // rule.look_every
    alpha_on, alpha_off = look_alphas(rule, look)
    z_on, z_off = _ND.inv_cdf(1.0 - alpha_on), _ND.inv_cdf(1.0 - alpha_off)
    upper, lower = score_bound(n, b, f, z_on, True), score_bound(n, b, f, z_off, False)
    where = f"look {look}/{rule.looks}"
    if tango_statistic(n, b, f, rule.margin) < -z_on:
        return Decision("on", n, move_rate, floor_rate, upper, lower,
                        f"excess over the floor below {rule.margin:g} at {rule.confidence:g} "
                        f"(upper bound {upper:.3f}, {where})")
    if tango_statistic(n, b, f, 0.0) > z_off and (b - f) / n > rule.margin / 2.0:
        return Decision("off", n, move_rate, floor_rate, upper, lower,
                        f"worse than the floor at {rule.confidence:g} "
                        f"(lower bound {lower:.3f}, {where})")
    if final:
        return Decision("off", n, move_rate, floor_rate, upper, lower,
                        f"not proven within {rule.max_pairs} pairs (upper bound {upper:.3f})")
    return Decision("trialling", n, move_rate, floor_rate, upper, lower,
                    f"undecided at {where} (upper bound {upper:.3f})")
