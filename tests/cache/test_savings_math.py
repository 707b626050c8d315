"""Issue 9 arithmetic, unit level: the holdout statistics, the per-minute rollups (against the
rows they fold), SLO attainment and goodput (attribution: tests/cache/test_attribution.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.holdout_stats import (
    HELPS,
    INCONCLUSIVE,
    MIN_PER_ARM,
    NO_DIFF,
    compare,
    holdout_report,
)
from prefixgate.cache.savings.summary import savings_document, slo_table
from prefixgate.config.schema import Slo, SloSettings


def _rec(holdout: bool, prompt: int, cached: int, ttft: float, usd: float) -> dict[str, Any]:
    return {"holdout": holdout, "prompt_tokens": prompt, "cached_tokens": cached,
            "ttft_ms": ttft, "input_usd": usd, "status": "ok"}


def _arms(n: int, effect: float, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(2 * n):
        ho = i % 2 == 1
        cached = int(rng.uniform(0, 200) + (0 if ho else effect * 600))
        uncached = 800 - cached
        out.append(_rec(ho, 800, cached, 10 + 0.05 * uncached + rng.uniform(0, 3),
                        uncached * 2.5e-6 + cached * 1.25e-6))
    return out


def test_holdout_finds_a_real_difference_with_an_interval_that_excludes_zero() -> None:
    rep = holdout_report(_arms(40, effect=1.0), seed=7)
    b = rep["buckets"][0]
    assert b["bucket"] == "0-1k" and rep["verdict"] == HELPS == b["verdict"]
    lo, hi = b["cached_share"]["ci95"]
    assert 0 < lo <= b["cached_share"]["diff"] <= hi
    assert b["ttft_p50_ms"]["ci95"][1] < 0 and b["input_usd_per_request"]["ci95"][1] < 0
    assert holdout_report(_arms(40, effect=1.0), seed=7) == rep        # seeded: deterministic


def test_holdout_says_no_difference_without_effect_and_inconclusive_on_a_tiny_sample() -> None:
    # no effect: family-wise 5 % false alarms over the four metrics (Bonferroni), so among 20
    # independent samples about one may be flagged, not the ~4 of uncorrected intervals
    verdicts = [holdout_report(_arms(60, effect=0.0, seed=s), seed=3)["verdict"]
                for s in range(1, 21)]
    assert verdicts.count(NO_DIFF) >= 18
    tiny = compare(*_split(_arms(MIN_PER_ARM - 1, effect=1.0)))
    assert tiny["verdict"] == INCONCLUSIVE and str(MIN_PER_ARM) in tiny["reason"]
    assert tiny["cached_share"]["diff"] > 0 and tiny["cached_share"]["ci95"] is None


def _split(rs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return [r for r in rs if not r["holdout"]], [r for r in rs if r["holdout"]]


def _row(ts: float, **kw: Any) -> LedgerRow:
    base: dict[str, Any] = {"route": "m*", "model": "gpt-4o", "backend": "up",
                            "prompt_tokens": 1000, "cached_tokens": 400, "output_tokens": 20,
                            "cf_cached_tokens": 100, "input_usd": 0.002, "cf_input_usd": 0.0024,
                            "ttft_ms": 50.0, "tpot_ms": 10.0, "edits": "hoist_volatile"}
    base.update(kw)
    return LedgerRow(ts=ts, **base)


def test_rollups_equal_the_rows_they_fold_and_series_bucket_them(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    t0 = 1_800_000_000.0
    rows = [_row(t0 + 5), _row(t0 + 30, prompt_tokens=None, cached_tokens=None, input_usd=None,
                                cf_input_usd=None, cf_cached_tokens=None),
            _row(t0 + 70, status="upstream_error", ttft_ms=None, tpot_ms=None),
            _row(t0 + 200, holdout=True, cf_source="holdout", cf_cached_tokens=400,
                 cf_input_usd=0.002, pass_tokens="")]
    for r in rows:
        led.write(r)
    rolls = led.rollups(t0 - 60, t0 + 3600)
    assert [r["minute"] for r in rolls] == [t0 // 60 * 60 + 60 * k for k in (0, 1, 3)]
    d = rollup.total(rolls)
    assert d["requests"] == 4 and d["errors"] == 1 and d["no_usage"] == 1 and d["holdout"] == 1
    assert d["prompt_tokens"] == 3000 and d["cached_tokens"] == 1200
    assert d["cf_source"] == {"modelled": 2, "none": 1, "holdout": 1}
    assert d["input_usd"] == pytest.approx(0.006) and d["cf_input_usd"] == pytest.approx(0.0068)
    doc = savings_document(led, "1h", now=t0 + 300)
    tot = doc["totals"]
    assert tot["saved_usd"] == pytest.approx(0.0008) and tot["no_usage_reported"] == 1
    assert tot["saved_tokens"] == (400 - 100) * 2 + 0 and tot["cached_share"] == 0.4
    s = doc["series"]
    # 60 minute buckets + the partial one the minute-aligned start adds
    assert sum(s["requests"]) == 4 and len(s["ts"]) == 61 and s["saved_usd"][-1] is None
    nonzero = [(r, sr) for r, sr in zip(s["requests"], s["saved_usd"]) if r]
    assert nonzero == [(2, pytest.approx(0.0004)), (1, pytest.approx(0.0004)),
                       (1, pytest.approx(0.0))]
    assert doc["lengths"]["prompt"]["counts"][rollup.bucket(rollup.PROMPT_EDGES, 1000)] == 3
    led.close()


def test_hist_percentile_is_within_a_bucket_of_the_exact_one() -> None:
    xs = [random.Random(2).uniform(5, 5000) for _ in range(500)]
    hist: dict[str, int] = {}
    for x in xs:
        k = str(rollup.bucket(rollup.LAT_EDGES_MS, x))
        hist[k] = hist.get(k, 0) + 1
    exact = sorted(xs)[int(0.95 * 499)]
    assert abs(rollup.hist_percentile(hist, 95) - exact) / exact < 0.125  # type: ignore[operator]


def test_slo_attainment_and_goodput_per_route_with_defaults() -> None:
    rows = [{"route": "fast", "ttft_ms": t, "tpot_ms": p, "status": "ok"}
            for t, p in ((100, 5), (300, 5), (100, 50), (100, None))]
    rows += [{"route": "other", "ttft_ms": 1500, "tpot_ms": 100, "status": "ok"},
             {"route": "other", "ttft_ms": None, "tpot_ms": None, "status": "ok"}]
    table = {r["route"]: r for r in slo_table(rows, SloSettings(
        routes={"fast": Slo(ttft_ms=200, tpot_ms=20)}))}
    fast, other = table["fast"], table["other"]
    assert (fast["ttft_ms"], fast["tpot_ms"]) == (200, 20)
    assert fast["ttft_attainment"] == 0.75 and fast["tpot_attainment"] == pytest.approx(2 / 3)
    assert fast["goodput"] == 0.5                      # (100, 5) and (100, None)
    assert (other["ttft_ms"], other["requests"], other["goodput"]) == (2000, 2, 1.0)


def test_identical_arms_with_a_constant_price_are_no_difference_not_float_noise() -> None:
    rs = [_rec(i % 2 == 1, 5000, 40 + i % 7, 100.0 + i % 5, 0.01) for i in range(120)]
    rep = holdout_report(rs, seed=1)
    assert rep["verdict"] == NO_DIFF, rep["reason"]
    assert rep["overall"]["input_usd_per_request"]["diff"] == pytest.approx(0.0, abs=1e-15)


def test_a_ledger_from_before_rollups_is_backfilled_on_open(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, ts REAL, endpoint TEXT, "
               "route TEXT, model TEXT, backend TEXT, status TEXT, http_status INTEGER, "
               "prompt_tokens INTEGER, cached_tokens INTEGER)")
    for i in range(3):
        db.execute("INSERT INTO requests (ts, route, model, backend, status, http_status, "
                   "prompt_tokens, cached_tokens) VALUES (?, 'r', 'm', 'b', 'ok', 200, 100, ?)",
                   (1_800_000_000.0 + 61 * i, 10 * i))
    db.commit()
    db.close()
    led = Ledger(path)
    d = rollup.total(led.rollups(0, 2e9))
    assert (d["requests"], d["prompt_tokens"], d["cached_tokens"]) == (3, 300, 30)
    led.write(_row(1_800_000_500.0))
    led.close()
    assert rollup.total(Ledger(path).rollups(0, 2e9))["requests"] == 4   # not folded twice
