"""Holdout A/B statistics (issue 9, item 2): rewritten vs held-out requests, per prompt length.

Pure functions over ledger-like records ``{"holdout", "prompt_tokens", "cached_tokens",
"input_usd", "ttft_ms"}``. Per prompt-length bucket (:data:`BUCKETS`, by the request's reported
prompt tokens) and for all requests pooled, four metrics are compared, rewritten minus holdout:

- ``cached_share``: sum of cached tokens / sum of prompt tokens (requests reporting both);
- ``input_usd_per_request``: mean prompt cost (priced requests);
- ``ttft_p50_ms`` / ``ttft_p95_ms``: TTFT percentiles (requests with a TTFT).

Each difference gets a 95 % percentile-bootstrap interval: both arms resampled with replacement
:data:`BOOTSTRAP_ROUNDS` times, the statistic recomputed, the 2.5th and 97.5th percentiles of
the differences taken. The generator is seeded from the caller's seed and the bucket / metric
names, so the same records always give the same interval. An arm larger than
:data:`BOOTSTRAP_MAX_N` is resampled from an evenly spaced subsample of that size (bounded work;
the point estimate still uses every request).

Verdict (per bucket and pooled): ``inconclusive`` when either arm has fewer than
:data:`MIN_PER_ARM` requests (reason says so); else each metric whose Bonferroni-corrected
interval (``1 - 0.05 / 4``, from the same resamples; family-wise 5 % over the four metrics)
excludes 0 counts for rewriting (higher cached share, lower cost, lower TTFT) or against it.
``rewriting helps``: some for, none against; ``rewriting hurts``: the reverse; ``no difference``:
no interval excludes 0; ``inconclusive`` (reason ``mixed``): both.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

MIN_PER_ARM = 20
"""Fewer requests than this in either arm: the verdict is ``inconclusive``."""
BOOTSTRAP_ROUNDS = 300
BOOTSTRAP_MAX_N = 500
BUCKETS: list[tuple[str, int, float]] = [
    ("0-1k", 0, 1024), ("1k-4k", 1024, 4096), ("4k-16k", 4096, 16384),
    ("16k-64k", 16384, 65536), ("64k+", 65536, float("inf"))]
HELPS, HURTS, NO_DIFF, INCONCLUSIVE = ("rewriting helps", "rewriting hurts", "no difference",
                                       "inconclusive")

Rec = Mapping[str, Any]
Stat = Callable[[Sequence[Rec]], float | None]


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def cached_share(rs: Sequence[Rec]) -> float | None:
    """Cached / prompt tokens over records reporting both; None when none does."""
    both = [r for r in rs if r.get("prompt_tokens") is not None
            and r.get("cached_tokens") is not None]
    p = sum(r["prompt_tokens"] for r in both)
    return sum(r["cached_tokens"] for r in both) / p if p else None


def usd_per_request(rs: Sequence[Rec]) -> float | None:
    """Mean ``input_usd`` over priced records."""
    xs = [r["input_usd"] for r in rs if r.get("input_usd") is not None]
    return sum(xs) / len(xs) if xs else None


def ttft_p(p: float) -> Stat:
    """The ``p``-th TTFT percentile (ms) of records with a TTFT."""
    return lambda rs: _pct([r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None], p)


# name -> (statistic, +1 when higher is better for rewriting / -1 when lower is)
METRICS: dict[str, tuple[Stat, int]] = {
    "cached_share": (cached_share, +1),
    "input_usd_per_request": (usd_per_request, -1),
    "ttft_p50_ms": (ttft_p(50), -1),
    "ttft_p95_ms": (ttft_p(95), -1),
}


def _rng(seed: int, *names: str) -> random.Random:
    h = hashlib.sha256(":".join((str(seed), *names)).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "big"))


def _thin(rs: Sequence[Rec]) -> Sequence[Rec]:
    if len(rs) <= BOOTSTRAP_MAX_N:
        return rs
    step = len(rs) / BOOTSTRAP_MAX_N
    return [rs[int(i * step)] for i in range(BOOTSTRAP_MAX_N)]


def bootstrap_diffs(a: Sequence[Rec], b: Sequence[Rec], stat: Stat, rng: random.Random,
                    rounds: int = BOOTSTRAP_ROUNDS) -> list[float]:
    """``stat(resample of a) - stat(resample of b)`` for ``rounds`` resamples (where both are
    defined); empty when either arm is."""
    a, b = _thin(a), _thin(b)
    if not a or not b:
        return []
    diffs = []
    for _ in range(rounds):
        ra = stat([a[rng.randrange(len(a))] for _ in range(len(a))])
        rb = stat([b[rng.randrange(len(b))] for _ in range(len(b))])
        if ra is not None and rb is not None:
            diffs.append(ra - rb)
    return diffs


def interval(diffs: list[float], alpha: float = 0.05,
             rounds: int = BOOTSTRAP_ROUNDS) -> tuple[float, float] | None:
    """The ``1 - alpha`` percentile interval of bootstrap ``diffs``; None when the statistic
    was undefined in most of the ``rounds`` resamples."""
    if len(diffs) < rounds // 2:
        return None
    lo, hi = _pct(diffs, 50 * alpha), _pct(diffs, 100 - 50 * alpha)
    assert lo is not None and hi is not None
    return (lo, hi)


def compare(rewritten: Sequence[Rec], holdout: Sequence[Rec], seed: int = 0,
            label: str = "all") -> dict[str, Any]:
    """One bucket's comparison: ``{"bucket", "n_rewritten", "n_holdout", <metric>:
    {"rewritten", "holdout", "diff", "ci95"}, "verdict", "reason"}`` (None where a figure is
    undefined)."""
    out: dict[str, Any] = {"bucket": label, "n_rewritten": len(rewritten),
                           "n_holdout": len(holdout)}
    small = min(len(rewritten), len(holdout)) < MIN_PER_ARM
    good, bad = [], []
    for name, (stat, sign) in METRICS.items():
        va, vb = stat(rewritten), stat(holdout)
        diff = None if va is None or vb is None else va - vb
        ci = strict = None
        if not small and diff is not None:
            diffs = bootstrap_diffs(rewritten, holdout, stat, _rng(seed, label, name))
            ci, strict = interval(diffs), interval(diffs, 0.05 / len(METRICS))
        out[name] = {"rewritten": va, "holdout": vb, "diff": diff,
                     "ci95": None if ci is None else [ci[0], ci[1]]}
        if strict is not None and (strict[0] > 0 or strict[1] < 0):
            (good if (strict[0] > 0) == (sign > 0) else bad).append(name)
    out["verdict"], out["reason"] = verdict(small, good, bad)
    return out


def verdict(small: bool, good: list[str], bad: list[str]) -> tuple[str, str]:
    """(verdict, reason) from the sample size and the metrics whose interval excludes 0."""
    if small:
        return INCONCLUSIVE, f"fewer than {MIN_PER_ARM} requests in an arm"
    if good and bad:
        return INCONCLUSIVE, f"mixed: better {', '.join(good)}; worse {', '.join(bad)}"
    if good:
        return HELPS, "better " + ", ".join(good)
    if bad:
        return HURTS, "worse " + ", ".join(bad)
    return NO_DIFF, "every 95% interval contains 0"


def bucket_of(prompt_tokens: int) -> str:
    """The label of the prompt-length bucket of ``prompt_tokens``."""
    return next(label for label, lo, hi in BUCKETS if lo <= prompt_tokens < hi)


def holdout_report(records: Iterable[Rec], seed: int = 0) -> dict[str, Any]:
    """``{"verdict", "reason", "overall": compare(all), "buckets": [compare(bucket), ...]}``
    over ok records with reported prompt tokens; only buckets holding a request appear."""
    rs = [r for r in records if (r.get("status") or "ok") == "ok"
          and r.get("prompt_tokens") is not None]
    overall = compare([r for r in rs if not r.get("holdout")],
                      [r for r in rs if r.get("holdout")], seed)
    buckets = []
    for label, lo, hi in BUCKETS:
        inside = [r for r in rs if lo <= r["prompt_tokens"] < hi]
        if inside:
            buckets.append(compare([r for r in inside if not r.get("holdout")],
                                   [r for r in inside if r.get("holdout")], seed, label))
    return {"verdict": overall["verdict"], "reason": overall["reason"], "overall": overall,
            "buckets": buckets}
