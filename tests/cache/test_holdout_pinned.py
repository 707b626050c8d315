"""Holdout statistics pinned to hand-computed numbers (issue 21): :mod:`prefixgate.cache.savings.holdout_stats`.

The module docstring is the source of each rule: the four metrics (cached share = sum of
cached / sum of prompt tokens over requests reporting both; mean prompt cost over priced
requests; TTFT p50 / p95 with numpy's linear percentile), the differences rewritten minus
holdout, the percentile-bootstrap interval, the verdict (MIN_PER_ARM, Bonferroni over the four
metrics, sign per metric, a relative float tolerance), the buckets by prompt length, and only
ok requests with reported prompt tokens counted. Arms of constant values make the bootstrap
exact: every resample has the same statistic, so each interval is a point computed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.savings import holdout_stats as hs
from prefixgate.cache.savings.holdout_stats import (
    HELPS,
    HURTS,
    INCONCLUSIVE,
    METRICS,
    MIN_PER_ARM,
    NO_DIFF,
    bucket_of,
    compare,
    holdout_report,
    interval,
)


def rec(prompt: int = 1000, cached: int | None = 0, usd: float | None = 0.001,
        ttft: float | None = 100.0, holdout: bool = False, status: str = "ok") -> dict:
    return {"prompt_tokens": prompt, "cached_tokens": cached, "input_usd": usd, "ttft_ms": ttft,
            "holdout": holdout, "status": status}


def test_each_metric_point_by_hand() -> None:
    """cached share over requests with both figures: (50 + 0) / (100 + 300) = 0.125; mean
    cost of the priced ones (0.01 + 0.03) / 2 = 0.02; TTFT p50 of 100..400 = 250, p95 = 300 +
    0.85 * 100 = 385 (linear)."""
    rs = [{"prompt_tokens": 100, "cached_tokens": 50, "input_usd": 0.01, "ttft_ms": 100.0},
          {"prompt_tokens": 300, "cached_tokens": 0, "input_usd": 0.03, "ttft_ms": 200.0},
          {"prompt_tokens": None, "cached_tokens": 10, "input_usd": None, "ttft_ms": 300.0},
          {"prompt_tokens": 200, "cached_tokens": None, "ttft_ms": 400.0}]
    assert METRICS["cached_share"].point(rs) == 0.125
    assert METRICS["input_usd_per_request"].point(rs) == 0.02
    assert METRICS["ttft_p50_ms"].point(rs) == 250.0
    assert METRICS["ttft_p95_ms"].point(rs) == pytest.approx(385.0, rel=1e-12)
    assert METRICS["cached_share"].point([{"prompt_tokens": 0, "cached_tokens": 0}]) is None  # 0/0
    assert METRICS["ttft_p50_ms"].point([{"ttft_ms": None}]) is None
    v, w = METRICS["cached_share"].arrays(rs)
    assert v.tolist() == [50.0, 0.0] and w.tolist() == [100.0, 300.0]
    v, w = METRICS["ttft_p50_ms"].arrays(rs)
    assert v.tolist() == [100.0, 200.0, 300.0, 400.0] and w.tolist() == [1.0] * 4


def arms(n_r: int, n_h: int, r: dict, h: dict) -> tuple[list[dict], list[dict]]:
    return [dict(r) for _ in range(n_r)], [dict(h, holdout=True) for _ in range(n_h)]


def test_constant_arms_give_exact_differences_and_point_intervals() -> None:
    """Rewritten: 900 of 1000 cached, $0.0004, 80 ms; holdout: 100 of 1000, $0.0010, 200 ms.
    Differences 0.8, -0.0006, -120, -120 and each interval the point itself: helps on all four."""
    r, h = arms(25, 30, rec(cached=900, usd=0.0004, ttft=80.0), rec(cached=100, usd=0.001, ttft=200.0))
    out = compare(r, h)
    assert (out["n_rewritten"], out["n_holdout"], out["bucket"]) == (25, 30, "all")
    assert out["cached_share"]["rewritten"] == 0.9 and out["cached_share"]["holdout"] == 0.1
    assert abs(out["cached_share"]["diff"] - 0.8) < 1e-12
    lo, hi = out["cached_share"]["ci95"]
    assert abs(lo - 0.8) < 1e-12 and abs(hi - 0.8) < 1e-12
    assert abs(out["input_usd_per_request"]["diff"] + 0.0006) < 1e-15
    assert out["ttft_p50_ms"] == {"rewritten": 80.0, "holdout": 200.0, "diff": -120.0,
                                  "ci95": [-120.0, -120.0]}
    assert out["ttft_p95_ms"]["diff"] == -120.0
    assert out["verdict"] == HELPS
    assert out["reason"] == "better cached_share, input_usd_per_request, ttft_p50_ms, ttft_p95_ms"


def test_the_reverse_hurts_and_a_split_is_mixed() -> None:
    r, h = arms(20, 20, rec(cached=100, usd=0.001, ttft=200.0), rec(cached=900, usd=0.0004, ttft=80.0))
    out = compare(r, h)
    assert out["verdict"] == HURTS
    assert out["reason"] == "worse cached_share, input_usd_per_request, ttft_p50_ms, ttft_p95_ms"
    r, h = arms(20, 20, rec(cached=900, usd=0.001, ttft=300.0), rec(cached=100, usd=0.001, ttft=80.0))
    out = compare(r, h)
    assert out["verdict"] == INCONCLUSIVE
    assert out["reason"] == "mixed: better cached_share; worse ttft_p50_ms, ttft_p95_ms"
    assert out["input_usd_per_request"]["diff"] == 0.0


def test_equal_arms_are_no_difference_even_with_float_noise() -> None:
    """30 and 47 requests at $0.1 each: the two means differ by ~8e-17 in floats; that is not
    a difference (the relative tolerance), nor is anything else here."""
    r, h = arms(30, 47, rec(usd=0.1, cached=10), rec(usd=0.1, cached=10))
    out = compare(r, h)
    assert out["input_usd_per_request"]["diff"] != 0.0  # the noise is really there
    assert out["verdict"] == NO_DIFF and out["reason"] == "every 95% interval contains 0"


def test_min_per_arm_edge() -> None:
    """Fewer than MIN_PER_ARM (20) in either arm: inconclusive, no intervals, points still
    computed; exactly 20 in both: judged."""
    r, h = arms(MIN_PER_ARM, MIN_PER_ARM - 1, rec(cached=900), rec(cached=100))
    out = compare(r, h)
    assert out["verdict"] == INCONCLUSIVE and out["reason"] == "fewer than 20 requests in an arm"
    assert out["cached_share"]["ci95"] is None and abs(out["cached_share"]["diff"] - 0.8) < 1e-12
    r, h = arms(MIN_PER_ARM - 1, MIN_PER_ARM, rec(cached=900), rec(cached=100))
    assert compare(r, h)["verdict"] == INCONCLUSIVE
    r, h = arms(MIN_PER_ARM, MIN_PER_ARM, rec(cached=900), rec(cached=100))
    assert compare(r, h)["verdict"] == HELPS


def test_a_metric_missing_in_one_arm_has_no_diff_and_no_interval() -> None:
    r, h = arms(25, 25, rec(cached=900, usd=None), rec(cached=100, usd=0.001))
    out = compare(r, h)
    assert out["input_usd_per_request"] == {"rewritten": None, "holdout": 0.001, "diff": None, "ci95": None}
    assert out["verdict"] == HELPS and out["reason"] == "better cached_share"


def test_interval_percentiles_and_its_undefined_edge() -> None:
    """The 95 % interval of 0..399 is numpy's 2.5th / 97.5th percentiles: 9.975, 389.025; the
    Bonferroni one (alpha 0.05/4) is wider. Fewer than rounds // 2 defined resamples: None."""
    d = np.arange(400, dtype=float)
    assert interval(d) == pytest.approx((9.975, 389.025), rel=1e-12)
    # alpha 0.0125: the 0.625th and 99.375th percentiles, 0.00625 * 399 and 0.99375 * 399
    assert interval(d, 0.05 / 4) == pytest.approx((2.49375, 396.50625), rel=1e-12)
    assert interval(np.arange(200, dtype=float)) is not None  # exactly half defined
    assert interval(np.arange(199, dtype=float)) is None


def test_bootstrap_drops_undefined_resamples_and_is_seeded() -> None:
    """A ratio resample with a zero denominator is undefined and dropped; the same seed gives
    the same interval, another seed another one."""
    m = METRICS["cached_share"]
    a = [{"prompt_tokens": 0, "cached_tokens": 0}] * 3 + [{"prompt_tokens": 10, "cached_tokens": 5}]
    b = [{"prompt_tokens": 10, "cached_tokens": 5}]
    d = hs.bootstrap_diffs(a, b, m, np.random.default_rng(1), rounds=400)
    n_undef = 400 - len(d)
    assert 0 < n_undef < 400 and not np.isnan(d).any()  # (3/4)^4 of resamples: ~32 % undefined
    assert hs.bootstrap_diffs([], b, m, np.random.default_rng(1)).size == 0
    assert hs.bootstrap_diffs(a, [{"cached_tokens": 1}], m, np.random.default_rng(1)).size == 0
    rng = np.random.default_rng(7)
    r = [rec(ttft=float(rng.integers(50, 500))) for _ in range(40)]
    h = [rec(ttft=float(rng.integers(50, 500)), holdout=True) for _ in range(40)]
    c0, c0b, c1 = compare(r, h, seed=0), compare(r, h, seed=0), compare(r, h, seed=1)
    assert c0["ttft_p50_ms"]["ci95"] == c0b["ttft_p50_ms"]["ci95"]
    assert c0["ttft_p50_ms"]["ci95"] != c1["ttft_p50_ms"]["ci95"]
    # the stream depends on the bucket and the metric too
    assert compare(r, h, label="0-1k")["ttft_p50_ms"]["ci95"] != c0["ttft_p50_ms"]["ci95"]
    assert c0["ttft_p50_ms"]["ci95"] != c0["ttft_p95_ms"]["ci95"]


def test_thin_takes_evenly_spaced_records_over_the_cap() -> None:
    n = hs.BOOTSTRAP_MAX_N
    v = np.arange(n, dtype=float)
    assert hs._thin(v, v)[0] is v
    v2 = np.arange(2 * n, dtype=float)
    t, w = hs._thin(v2, v2 + 1)
    assert t.tolist() == list(range(0, 2 * n, 2)) and w.tolist() == list(range(1, 2 * n + 1, 2))
    v3 = np.arange(n + 1, dtype=float)
    assert len(hs._thin(v3, v3)[0]) == n


def test_bucket_of_edges() -> None:
    assert [bucket_of(t) for t in (0, 1023, 1024, 4095, 4096, 16383, 16384, 65535, 65536, 10**7)] == [
        "0-1k", "0-1k", "1k-4k", "1k-4k", "4k-16k", "4k-16k", "16k-64k", "16k-64k", "64k+", "64k+"]


def test_holdout_report_counts_only_ok_requests_with_prompt_tokens_by_bucket() -> None:
    """Errored requests and requests without prompt tokens are left out (of the arms and of the
    buckets); only buckets holding a request appear, in BUCKETS order."""
    rows = ([rec(prompt=2000, cached=1800) for _ in range(20)]
            + [rec(prompt=2000, cached=200, holdout=True) for _ in range(20)]
            + [rec(prompt=500, cached=0, status="error") for _ in range(30)]
            + [{"prompt_tokens": None, "cached_tokens": 5, "holdout": True} for _ in range(5)]
            + [rec(prompt=100_000, cached=0, status=None)])
    out = holdout_report(rows)
    assert (out["overall"]["n_rewritten"], out["overall"]["n_holdout"]) == (21, 20)
    assert [b["bucket"] for b in out["buckets"]] == ["1k-4k", "64k+"]
    b1 = out["buckets"][0]
    assert (b1["n_rewritten"], b1["n_holdout"], b1["verdict"]) == (20, 20, HELPS)
    assert abs(b1["cached_share"]["diff"] - 0.8) < 1e-12
    # overall cached share: (20*1800 + 0) / (20*2000 + 100000) = 36000 / 140000
    assert out["overall"]["cached_share"]["rewritten"] == 36000 / 140000
    assert out["verdict"] == out["overall"]["verdict"] and out["reason"] == out["overall"]["reason"]


RECS = st.lists(st.builds(rec, prompt=st.integers(1, 50_000), cached=st.integers(0, 1000),
                          usd=st.floats(0, 1), ttft=st.floats(1, 5000),
                          holdout=st.booleans()), max_size=50)


@settings(max_examples=40)
@given(RECS)
def test_a_request_nothing_could_improve_reports_no_difference(rs: list[dict]) -> None:
    """The same requests in both arms: every difference is exactly 0 and nothing is a
    difference (the verdict is ``no difference``, or ``inconclusive`` for small arms)."""
    out = compare(rs, rs)
    for name in METRICS:
        assert out[name]["diff"] in (0.0, None)
    assert out["verdict"] in (NO_DIFF, INCONCLUSIVE) and not out["reason"].startswith("mixed")


@given(RECS.filter(bool), st.integers(0, 49), st.integers(1, 1000))
def test_cached_share_is_monotone_in_cached_tokens(rs: list[dict], i: int, more: int) -> None:
    """More cached tokens on one request never lowers the cached share."""
    m = METRICS["cached_share"]
    before = m.point(rs)
    j = i % len(rs)
    after = m.point([dict(r, cached_tokens=r["cached_tokens"] + more) if k == j else r
                     for k, r in enumerate(rs)])
    assert before is not None and after is not None and after > before


# ---- issue 21, round two: the seeding, the bootstrap's edges, the noise tolerance, buckets --------

def _arm(n: int, k: int) -> list[dict[str, object]]:
    return [{"prompt_tokens": 600 + i, "cached_tokens": (i * k) % 500, "input_usd": 0.001 * (i % 7),
             "ttft_ms": 100.0 + (i * k) % 50} for i in range(n)]


RW, HO = _arm(25, 37), [{**r, "holdout": True} for r in _arm(25, 13)]


def test_each_metric_draws_from_its_own_seeded_generator() -> None:
    """The generator of (seed, bucket, metric) is pinned: sha256("seed:bucket:metric"), first 8
    bytes big-endian; compare's intervals are exactly the bootstrap of that generator."""
    assert hs._rng(0, "all", "ttft_p50_ms").integers(0, 10**9) == 392167128
    assert hs._rng(7, "1k-4k", "cached_share").integers(0, 10**9) == 369758890
    got = compare(RW, HO, seed=3)
    for name, metric in METRICS.items():
        d = hs.bootstrap_diffs(RW, HO, metric, hs._rng(3, "all", name))
        ci = interval(d)
        assert ci is not None and got[name]["ci95"] == [ci[0], ci[1]]


def test_the_default_seed_is_zero_and_the_report_passes_its_seed_on() -> None:
    assert compare(RW, HO) == compare(RW, HO, seed=0)
    assert holdout_report(RW + HO) == holdout_report(RW + HO, seed=0)
    rep = holdout_report(RW + HO, seed=5)
    assert rep["overall"] == compare(RW, HO, seed=5)
    assert rep["buckets"] == [compare(RW, HO, seed=5, label="0-1k")]  # every prompt is under 1024


def test_the_bootstrap_with_one_record_per_arm_and_with_an_empty_arm() -> None:
    m = METRICS["ttft_p50_ms"]
    d = hs.bootstrap_diffs([{"ttft_ms": 5.0}], [{"ttft_ms": 1.0}], m, hs._rng(0, "x"), rounds=10)
    assert d.tolist() == [4.0] * 10  # index 0 is drawn (the only one)
    assert len(hs.bootstrap_diffs([], [{"ttft_ms": 1.0}], m, hs._rng(0, "x"))) == 0
    assert len(hs.bootstrap_diffs([{"ttft_ms": 1.0}], [], m, hs._rng(0, "x"))) == 0


def test_interval_needs_half_the_rounds_rounded_down() -> None:
    assert interval(np.array([1.0, 2.0]), rounds=5) is not None  # 2 >= 5 // 2
    assert interval(np.array([1.0]), rounds=5) is None


def test_a_ratio_under_a_fractional_denominator() -> None:
    share = METRICS["cached_share"]
    assert share.of(np.array([[0.25]]), np.array([[0.5]])).tolist() == [0.5]


def test_the_mixed_reason_lists_each_side() -> None:
    assert hs.verdict(False, ["a", "b"], ["c", "d"]) == (
        INCONCLUSIVE, "mixed: better a, b; worse c, d")


def _share_arms(rw_cached: int, rw_prompt: int, ho_cached: int, ho_prompt: int
                ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    rw = [{"prompt_tokens": rw_prompt, "cached_tokens": rw_cached}] * MIN_PER_ARM
    ho = [{"prompt_tokens": ho_prompt, "cached_tokens": ho_cached, "holdout": True}] * MIN_PER_ARM
    return rw, ho


def test_a_tiny_share_against_zero_is_still_a_difference() -> None:
    """The noise tolerance is relative to the larger figure: 1e-10 against 0 is a difference
    (a tolerance of 1e-9 absolute would hide it)."""
    rw, ho = _share_arms(0, 1000, 1, 10**10)
    assert compare(rw, ho)["verdict"] == HURTS
    rw, ho = _share_arms(1, 10**10, 0, 1000)
    assert compare(rw, ho)["verdict"] == HELPS


def test_two_arms_of_zero_share_are_no_difference() -> None:
    rw, ho = _share_arms(0, 1000, 0, 1000)
    got = compare(rw, ho)
    assert got["cached_share"]["ci95"] == [0.0, 0.0] and got["verdict"] == NO_DIFF


def test_buckets_include_their_lower_edge_and_exclude_their_upper() -> None:
    recs = [{"prompt_tokens": 0}, {"prompt_tokens": 1023}, {"prompt_tokens": 1024},
            {"prompt_tokens": 4095, "holdout": True}]
    got = {b["bucket"]: (b["n_rewritten"], b["n_holdout"]) for b in holdout_report(recs)["buckets"]}
    assert got == {"0-1k": (2, 0), "1k-4k": (1, 1)}
