"""Holdout A/B statistics (issue 9, item 2): rewritten vs held-out requests, per prompt length.

Pure functions over ledger-like records ``{"holdout", "prompt_tokens", "cached_tokens",
"input_usd", "ttft_ms"}``. Per prompt-length bucket (:data:`BUCKETS`, by the request's reported
prompt tokens) and for all requests pooled, four metrics are compared, rewritten minus holdout:

- ``cached_share``: sum of cached tokens / sum of prompt tokens (requests reporting both);
- ``input_usd_per_request``: mean prompt cost (priced requests);
- ``ttft_p50_ms`` / ``ttft_p95_ms``: TTFT percentiles (requests with a TTFT).

Each difference gets a 95 % percentile-bootstrap interval: within each metric, the requests of
both arms that have the figure are resampled with replacement :data:`BOOTSTRAP_ROUNDS` times
(numpy, all rounds at once), the statistic recomputed, the 2.5th and 97.5th percentiles of the
differences taken. The generator is seeded from the caller's seed and the bucket / metric names,
so the same records always give the same interval. An arm larger than :data:`BOOTSTRAP_MAX_N`
is resampled from an evenly spaced subsample of that size (bounded work; the point estimate
still uses every request).

Verdict (per bucket and pooled): ``inconclusive`` when either arm has fewer than
:data:`MIN_PER_ARM` requests (reason says so); else each metric whose Bonferroni-corrected
interval (``1 - 0.05 / 4``, from the same resamples; family-wise 5 % over the four metrics)
excludes 0 counts for rewriting (higher cached share, lower cost, lower TTFT) or against it.
``rewriting helps``: some for, none against; ``rewriting hurts``: the reverse; ``no difference``:
no interval excludes 0; ``inconclusive`` (reason ``mixed``): both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_PER_ARM = 20
"""Fewer requests than this in either arm: the verdict is ``inconclusive``."""
BOOTSTRAP_ROUNDS = 400
BOOTSTRAP_MAX_N = 2000
BUCKETS: list[tuple[str, int, float]] = [
    ("0-1k", 0, 1024), ("1k-4k", 1024, 4096), ("4k-16k", 4096, 16384),
    ("16k-64k", 16384, 65536), ("64k+", 65536, float("inf"))]
HELPS, HURTS, NO_DIFF, INCONCLUSIVE = ("rewriting helps", "rewriting hurts", "no difference",
                                       "inconclusive")

Rec = Mapping[str, Any]


@dataclass(frozen=True)
class Metric:
    """``kind``: ``ratio`` (sum of ``field`` / sum of ``weight``), ``mean`` or ``p<N>``
    (percentile); ``sign``: +1 when higher is better for rewriting, -1 when lower is."""

    field: str
    kind: str
    sign: int
    weight: str = ""

    def arrays(self, rs: Sequence[Rec]) -> tuple[np.ndarray, np.ndarray]:
        """(values, weights) of the records that have the figure (weights: ones for
        non-ratio metrics)."""
        keep = [r for r in rs if r.get(self.field) is not None
                and (not self.weight or r.get(self.weight) is not None)]
        v = np.array([float(r[self.field]) for r in keep], dtype=float)
        w = np.array([float(r[self.weight]) for r in keep], dtype=float) if self.weight \
            else np.ones(len(keep))
        return v, w

    def of(self, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The statistic of each row of ``v`` / ``w`` (shape rounds x n) -> shape (rounds,);
        NaN where undefined (a zero denominator)."""
        if self.kind == "ratio":
            den = w.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(den > 0, v.sum(axis=1) / np.where(den > 0, den, 1), np.nan)
        if self.kind == "mean":
            return v.mean(axis=1)  # type: ignore[no-any-return]
        return np.percentile(v, float(self.kind[1:]), axis=1)  # type: ignore[no-any-return]

    def point(self, rs: Sequence[Rec]) -> float | None:
        """The statistic over all of ``rs``; None when no record has the figure."""
        v, w = self.arrays(rs)
        if not len(v):
            return None
        x = float(self.of(v[None, :], w[None, :])[0])
        return None if np.isnan(x) else x


METRICS: dict[str, Metric] = {
    "cached_share": Metric("cached_tokens", "ratio", +1, weight="prompt_tokens"),
    "input_usd_per_request": Metric("input_usd", "mean", -1),
    "ttft_p50_ms": Metric("ttft_ms", "p50", -1),
    "ttft_p95_ms": Metric("ttft_ms", "p95", -1),
}


def _rng(seed: int, *names: str) -> np.random.Generator:
    h = hashlib.sha256(":".join((str(seed), *names)).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "big"))


def _thin(v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(v) <= BOOTSTRAP_MAX_N:
        return v, w
    idx = (np.arange(BOOTSTRAP_MAX_N) * (len(v) / BOOTSTRAP_MAX_N)).astype(int)
    return v[idx], w[idx]


def bootstrap_diffs(a: Sequence[Rec], b: Sequence[Rec], metric: Metric,
                    rng: np.random.Generator, rounds: int = BOOTSTRAP_ROUNDS) -> np.ndarray:
    """``metric(resample of a) - metric(resample of b)`` for ``rounds`` resamples, undefined
    ones dropped; empty when either arm has no record with the figure."""
    (va, wa), (vb, wb) = (_thin(*metric.arrays(a)), _thin(*metric.arrays(b)))
    if not len(va) or not len(vb):
        return np.array([])
    ia = rng.integers(0, len(va), size=(rounds, len(va)))
    ib = rng.integers(0, len(vb), size=(rounds, len(vb)))
    d = metric.of(va[ia], wa[ia]) - metric.of(vb[ib], wb[ib])
    return d[~np.isnan(d)]  # type: ignore[no-any-return]


def interval(diffs: np.ndarray, alpha: float = 0.05,
             rounds: int = BOOTSTRAP_ROUNDS) -> tuple[float, float] | None:
    """The ``1 - alpha`` percentile interval of bootstrap ``diffs``; None when the statistic
    was undefined in most of the ``rounds`` resamples."""
    if len(diffs) < rounds // 2:
        return None
    lo, hi = np.percentile(diffs, [50 * alpha, 100 - 50 * alpha])
    return (float(lo), float(hi))


def compare(rewritten: Sequence[Rec], holdout: Sequence[Rec], seed: int = 0,
            label: str = "all") -> dict[str, Any]:
    """One bucket's comparison: ``{"bucket", "n_rewritten", "n_holdout", <metric>:
    {"rewritten", "holdout", "diff", "ci95"}, "verdict", "reason"}`` (None where a figure is
    undefined)."""
    out: dict[str, Any] = {"bucket": label, "n_rewritten": len(rewritten),
                           "n_holdout": len(holdout)}
    small = min(len(rewritten), len(holdout)) < MIN_PER_ARM
    good: list[str] = []
    bad: list[str] = []
    for name, metric in METRICS.items():
        va, vb = metric.point(rewritten), metric.point(holdout)
        diff = None if va is None or vb is None else va - vb
        ci = strict = None
        if not small and diff is not None:
            diffs = bootstrap_diffs(rewritten, holdout, metric, _rng(seed, label, name))
            ci, strict = interval(diffs), interval(diffs, 0.05 / len(METRICS))
        out[name] = {"rewritten": va, "holdout": vb, "diff": diff,
                     "ci95": None if ci is None else [ci[0], ci[1]]}
        # float noise (identical arms give +-1e-18) is not a difference: a relative tolerance
        eps = 1e-9 * max(abs(va or 0.0), abs(vb or 0.0))
        if strict is not None and (strict[0] > eps or strict[1] < -eps):
            (good if (strict[0] > eps) == (metric.sign > 0) else bad).append(name)
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
