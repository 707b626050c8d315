"""Prefill time saved (issue 19, item 8): ``prefixgate/cache/savings/time_saved.py``, the savings document
and the report's figures over it."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.holdout_stats import MIN_PER_ARM
from prefixgate.cache.savings.report import group_figures, saved_figures
from prefixgate.cache.savings.summary import savings_document
from prefixgate.cache.savings.time_saved import (
    MIN_UNCACHED,
    fit_rate,
    holdout_ttft_saved_s,
    prefill_rate,
    rates,
    time_saved,
)

A, B = 7.0, 0.05  # a self-hosted engine: 7 ms per request + 0.05 ms per uncached token


def row(prompt: int, cached: int, cf: int | None = None, *, route: str = "local*",
        backend: str = "engine", prefill: float | None = -1.0, **kw: Any) -> dict[str, Any]:
    """A ledger-like row; ``prefill`` -1 = the engine's exact time for its uncached tokens."""
    ms = A + B * (prompt - cached) if prefill == -1.0 else prefill
    return {"route": route, "backend": backend, "status": "ok", "prompt_tokens": prompt,
            "cached_tokens": cached, "cf_cached_tokens": cf, "prefill_ms": ms, **kw}


def test_the_rate_is_the_least_squares_slope_without_the_fixed_cost() -> None:
    rs = [row(1000 + 97 * i, 40 * i) for i in range(12)]
    rate = prefill_rate(rs)
    assert rate is not None and rate.method == "slope" and rate.samples == 12
    assert rate.ms_per_token == pytest.approx(B)  # not (A + B x) / x: the 7 ms are no token's


def test_too_few_or_all_equal_samples_fall_back_to_the_ratio() -> None:
    assert fit_rate([(100.0, 12.0), (300.0, 22.0)]) == (pytest.approx(34.0 / 400), "ratio")
    assert fit_rate([(100.0, 12.0)] * 5) == (pytest.approx(0.12), "ratio")
    assert fit_rate([(100.0, 30.0), (200.0, 20.0), (300.0, 10.0)])[1] == "ratio"  # slope <= 0
    assert fit_rate([]) is None
    # a slope steeper than the ratio means a negative fixed cost: noise, the ratio is kept
    # (issue 37: prompts of 900-1,100 uncached tokens on a contended CPU)
    noisy = [(900.0, 5000.0), (1000.0, 6500.0), (1100.0, 9800.0)]
    assert fit_rate(noisy) == (pytest.approx(21300.0 / 3000), "ratio")


def test_samples_need_the_engines_prefill_time_and_enough_uncached_tokens() -> None:
    assert prefill_rate([row(1000, 500, prefill=None)] * 5) is None   # vLLM: nothing reported
    assert prefill_rate([row(1000, 1000 - MIN_UNCACHED + 1)] * 5) is None
    assert prefill_rate([row(1000, 0, status="upstream_error")] * 5) is None


def test_time_saved_prices_what_rewriting_made_reusable_at_the_routes_rate() -> None:
    rs = [row(2000 + 50 * i, 1500 + 10 * i, 200) for i in range(10)]
    got = time_saved(rs)
    reuse = sum(r["cached_tokens"] - r["cf_cached_tokens"] for r in rs)
    assert got["prefill_s_saved"] == pytest.approx(reuse * B / 1000, rel=1e-6)
    assert got["prefill_s_cached"] == pytest.approx(sum(r["cached_tokens"] for r in rs) * B / 1000,
                                                    rel=1e-6)
    assert got["rows_with_rate"] == 10 and got["prefill_usd_saved"] is None
    priced = time_saved(rs, {"engine": 3.6})  # $3.60 an hour = $0.001 a second
    assert priced["prefill_usd_saved"] == pytest.approx(got["prefill_s_saved"] * 0.001, rel=1e-6)
    lost = time_saved([row(2000 + 50 * i, 200, 1500) for i in range(10)])
    assert lost["prefill_s_saved"] < 0  # rewriting cost hits: said, not hidden


def test_each_route_and_backend_has_its_own_rate() -> None:
    fast = [row(2000 + 50 * i, 1000, 0, backend="h200") for i in range(6)]
    slow = [row(2000 + 50 * i, 1000, 0, backend="cpu", prefill=A + 2.0 * (1000 + 50 * i))
            for i in range(6)]
    known = rates(fast + slow)
    assert known[("local*", "h200")].ms_per_token == pytest.approx(B)
    assert known[("local*", "cpu")].ms_per_token == pytest.approx(2.0)
    both = time_saved(fast + slow)["prefill_s_saved"]
    assert both == pytest.approx(6 * 1000 * (B + 2.0) / 1000)


def test_without_a_rate_or_a_counterfactual_the_figures_are_not_reported() -> None:
    none = time_saved([row(1000, 500, 100, prefill=None)] * 4)
    assert none == {"prefill_s_saved": None, "prefill_s_cached": None, "prefill_usd_saved": None,
                    "ttft_s_saved_holdout": None, "rows_with_rate": 0}
    no_cf = time_saved([row(1000 + i, 500) for i in range(4)])
    assert no_cf["prefill_s_saved"] is None and no_cf["prefill_s_cached"] is not None


def test_the_holdout_ttft_difference_is_summed_per_prompt_length_bucket() -> None:
    rng = random.Random(3)
    rs = [{"prompt_tokens": 2000, "ttft_ms": 300.0 + rng.random(), "holdout": False}
          for _ in range(MIN_PER_ARM)]
    rs += [{"prompt_tokens": 2000, "ttft_ms": 500.0 + rng.random(), "holdout": True}
           for _ in range(MIN_PER_ARM)]
    got = holdout_ttft_saved_s(rs)
    assert got == pytest.approx(MIN_PER_ARM * 0.2, abs=0.05)
    assert holdout_ttft_saved_s(rs[1:]) is None  # one arm below MIN_PER_ARM
    # a bucket with another length mix is compared within itself, not pooled
    other = [{"prompt_tokens": 100, "ttft_ms": 50.0, "holdout": h} for h in (False, True) * 5]
    assert holdout_ttft_saved_s(rs + other) == pytest.approx(got)


def _ledger(tmp_path: Path, n: int = 12) -> Ledger:
    led = Ledger(tmp_path / "l.sqlite")
    now = time.time()
    for i in range(n):
        led.write(LedgerRow(ts=now - 60 + i, route="local*", backend="engine", model="smollm2",
                            prompt_tokens=2000 + 50 * i, cached_tokens=1500, cf_cached_tokens=300,
                            prefill_ms=A + B * (500 + 50 * i), cf_source="modelled",
                            edits="hoist_volatile"))
    return led


def test_the_savings_document_and_the_report_carry_the_time_figures(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    doc = savings_document(led, "1h", usd_per_hour={"engine": 7.2})
    t, route = doc["totals"], doc["routes"][0]
    want = 12 * 1200 * B / 1000
    assert t["prefill_s_saved"] == pytest.approx(want) and route["prefill_s_saved"] == pytest.approx(want)
    assert t["prefill_s_cached"] == pytest.approx(12 * 1500 * B / 1000)
    assert t["prefill_usd_saved"] == pytest.approx(want * 7.2 / 3600)
    assert route["prefill_ms_per_token"] == pytest.approx(B) and route["prefill_rate_method"] == "slope"
    assert t["saved_usd"] is None  # no table price, no price_per_mtok: the money stays unreported
    rows = led.rows()
    assert saved_figures(rows)["prefill_s_saved"] == pytest.approx(want)
    assert group_figures(rows, "model")[0]["prefill_s_saved"] == pytest.approx(want)
