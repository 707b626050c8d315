"""The ``/api/savings`` figures pinned to hand-computed numbers (issue 21): :mod:`prefixgate.cache.savings`.

Source of each rule: the module docstring (``saved_usd = cf_input_usd - input_usd`` over
requests priced both ways; ``saved_tokens = (cached - cf_cached) + pruned``; None is "not
reported", never 0; SLO attainment over requests with the figure; goodput = share of requests
with a TTFT meeting both SLOs, a request without TPOT meeting the TPOT one), and each
function's docstring (cache-write premium at ``cache_write_5m - input`` per token; hit rate =
share of reporting requests with cached > 0; top breaks by tokens lost). Prices come from the
dated table (claude-3-5-sonnet: input $3, cache write 5 m $3.75 per M tokens).
Properties: totals add up over rows; a request nothing could improve reports 0 saved; saved
tokens are monotone in what they count.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache import rollup
from prefixgate.cache import savings as sv
from prefixgate.cache.ledger import Ledger, LedgerRow
from prefixgate.config.schema import Slo, SloSettings


def test_totals_by_hand() -> None:
    """2 priced requests: $0.003 paid vs $0.009 as sent -> saved $0.006 = 66.6667 %; cached
    reuse 1500 - 600 = 900 tokens + 250 pruned = 1150 saved tokens; cached share 1500 / 4000
    prompt tokens that reported it; counterfactual share 600 / 3000; TTFT p50 of 100, 200, 300
    = 200, p95 = 200 + 100 * 0.9 = 290."""
    data = {"requests": 3, "errors": 1, "priced": 2, "input_usd": 0.003, "cf_input_usd": 0.009,
            "prompt_tokens": 5000, "usage_prompt": 4000, "cached_tokens": 1500,
            "cf_prompt": 3000, "cf_cached_tokens": 600, "cf_actual_cached": 1500,
            "pruned_tokens": 250, "cf_source": {"modelled": 2, "none": 1}, "no_usage": 1,
            "output_tokens": 77, "cache_write_tokens": 40, "holdout": 1}
    rows = [{"ttft_ms": 100.0}, {"ttft_ms": None}, {"ttft_ms": 300.0}, {"ttft_ms": 200.0}]
    t = sv.totals(data, rows, 0.00003)
    assert t == {
        "requests": 3, "errors": 1, "input_usd": 0.003, "cf_input_usd": 0.009,
        "saved_usd": 0.006, "saved_pct": 0.666667, "prompt_tokens": 5000, "cached_tokens": 1500,
        "cf_cached_tokens": 600, "saved_tokens": 1150, "pruned_tokens": 250, "added_tokens": 0,
        "cached_share": 0.375, "cf_cached_share": 0.2, "ttft_p50_ms": 200.0, "ttft_p95_ms": 290.0,
        "cf_source": {"measured": 0, "modelled": 2, "holdout": 0, "none": 1},
        "no_usage_reported": 1, "output_tokens": 77, "cache_write_tokens": 40,
        "cache_write_premium_usd": 0.00003, "holdout_requests": 1}


def test_totals_without_prices_or_usage_are_null_not_zero() -> None:
    t = sv.totals({"requests": 1, "input_usd": 0.5, "cf_input_usd": 0.7}, [], None)
    assert (t["input_usd"], t["cf_input_usd"], t["saved_usd"], t["saved_pct"]) == (None,) * 4
    assert (t["cached_share"], t["cf_cached_share"], t["ttft_p50_ms"]) == (None, None, None)
    assert t["cache_write_premium_usd"] is None and t["saved_tokens"] == 0
    z = sv.totals({"priced": 1, "input_usd": 0.0, "cf_input_usd": 0.0, "usage_prompt": 0,
                   "cached_tokens": 0}, [], 0.0)
    assert z["saved_usd"] == 0.0 and z["saved_pct"] is None and z["cached_share"] is None


def test_write_premium_by_hand() -> None:
    """1000 tokens written on claude-3-5-sonnet: 1000 * (3.75 - 3.00) / 1e6 = $0.00075; gpt-4o
    writes cost the input price: +$0; an unpriced model adds nothing; none priced: None."""
    rolls = [{"model": "claude-3-5-sonnet-20241022", "data": {"cache_write_tokens": 1000}},
             {"model": "gpt-4o", "data": {"cache_write_tokens": 5000}},
             {"model": "no-such-model", "data": {"cache_write_tokens": 10**6}},
             {"model": "claude-3-5-sonnet-20241022", "data": {}}]
    assert sv.write_premium(rolls) == pytest.approx(0.00075, rel=1e-12)
    assert sv.write_premium([{"model": "no-such-model", "data": {"cache_write_tokens": 9}}]) is None
    assert sv.write_premium([{"model": "gpt-4o", "data": {}}]) == 0.0


def test_slots_align_and_drop_what_is_outside() -> None:
    """from 130 to 400 in 60 s buckets: start 120, ceil(280 / 60) = 5 slots [120, 420)."""
    rolls = [{"minute": 60, "data": {"requests": 9}}, {"minute": 120, "data": {"requests": 1}},
             {"minute": 180, "data": {"requests": 2}}, {"minute": 180, "data": {"requests": 3}},
             {"minute": 360, "data": {"requests": 4}}, {"minute": 420, "data": {"requests": 8}}]
    start, slots = sv.slots_of(rolls, 130, 400, 60)
    assert start == 120 and [s.get("requests", 0) for s in slots] == [1, 5, 0, 0, 4]
    start, slots = sv.slots_of(rolls, 120, 120, 300)
    assert start == 0 and len(slots) == 1  # an empty span still has one slot
    assert sv.slots_of([], 0, 600, 300)[1] == [{}, {}]


def test_series_by_hand() -> None:
    """A slot: 1000 prompt tokens reporting usage, 300 read, 200 written -> 500 uncached;
    saved $0.004 - $0.001; an empty slot has 0 counts and null share / saving / percentiles."""
    d = {"requests": 2, "usage_prompt": 1000, "cached_tokens": 300, "cache_write_tokens": 200,
         "pruned_tokens": 7, "priced": 1, "input_usd": 0.001, "cf_input_usd": 0.004,
         "ttft": {"0": 1}, "tpot": {}}
    over = {"requests": 1, "usage_prompt": 10, "cached_tokens": 8, "cache_write_tokens": 5}
    s = sv.series(600, [d, {}, over], 300)
    assert s["ts"] == [600, 900, 1200] and s["requests"] == [2, 0, 1]
    assert s["cached_share"] == [0.3, None, 0.8] and s["saved_usd"] == [0.003, None, None]
    assert s["tokens"] == {"cache_read": [300, 0, 8], "cache_write": [200, 0, 5],
                           "uncached": [500, 0, 0], "pruned": [7, 0, 0]}
    assert s["ttft_ms"]["p50"][0] == rollup.hist_percentile({"0": 1}, 50) and s["ttft_ms"]["p50"][1] is None
    assert s["tpot_ms"] == {"p50": [None] * 3, "p95": [None] * 3, "p99": [None] * 3}


def test_slo_table_by_hand() -> None:
    """Route r (SLO 500 ms / 50 ms): TTFTs 400, 500, 600 (an errored one left out); TPOTs 40,
    60, none -> TTFT attainment 2/3, TPOT 1/2; goodput: 400/40 ok, 500/60 misses TPOT,
    600 misses TTFT -> 1/3. Route s takes the default SLO (2000 / 200): one request without
    TTFT -> no attainment (None), goodput None."""
    rows = [{"route": "r", "ttft_ms": 400.0, "tpot_ms": 40.0},
            {"route": "r", "ttft_ms": 500.0, "tpot_ms": 60.0, "status": "ok"},
            {"route": "r", "ttft_ms": 600.0, "tpot_ms": None},
            {"route": "r", "ttft_ms": 1.0, "tpot_ms": 1.0, "status": "upstream_error"},
            {"route": "s", "ttft_ms": None, "tpot_ms": None},
            {"route": None, "ttft_ms": 10.0, "tpot_ms": None}]
    slo = SloSettings(routes={"r": Slo(ttft_ms=500.0, tpot_ms=50.0)})
    out = sv.slo_table(rows, slo)
    assert out == [
        {"route": "-", "ttft_ms": 2000.0, "tpot_ms": 200.0, "requests": 1, "n_ttft": 1, "n_tpot": 0,
         "ttft_attainment": 1.0, "tpot_attainment": None, "goodput": 1.0},
        {"route": "r", "ttft_ms": 500.0, "tpot_ms": 50.0, "requests": 3, "n_ttft": 3, "n_tpot": 2,
         "ttft_attainment": 0.666667, "tpot_attainment": 0.5, "goodput": 0.333333},
        {"route": "s", "ttft_ms": 2000.0, "tpot_ms": 200.0, "requests": 1, "n_ttft": 0, "n_tpot": 0,
         "ttft_attainment": None, "tpot_attainment": None, "goodput": None}]


def test_hit_rate_counts_zero_as_a_miss_and_unknown_as_nothing() -> None:
    rows = [{"cached_tokens": 0}, {"cached_tokens": 5}, {"cached_tokens": None}, {}, {"cached_tokens": 1}]
    assert sv.hit_rate(rows) == 2 / 3
    assert sv.hit_rate([{"cached_tokens": None}]) is None and sv.hit_rate([]) is None


def test_top_breaks_group_sum_and_sort_by_tokens_lost() -> None:
    recs = [{"region": "system", "kind": "edit", "token_offset": 10, "tokens_lost": 100},
            {"region": "system", "kind": "edit", "token_offset": 10, "tokens_lost": 50},
            {"region": "tools", "kind": "reorder", "token_offset": 0, "tokens_lost": 120},
            {"region": "msgs", "kind": "edit", "token_offset": 5, "tokens_lost": 120},
            {"region": "msgs", "kind": "edit", "token_offset": 5},
            {"region": "x", "kind": "y", "token_offset": 1, "tokens_lost": 1}]
    out = sv.top_breaks(recs, limit=3)
    assert out == [
        {"field": "system", "kind": "edit", "token_offset": 10, "tokens_lost": 150, "count": 2},
        {"field": "msgs", "kind": "edit", "token_offset": 5, "tokens_lost": 120, "count": 2},
        {"field": "tools", "kind": "reorder", "token_offset": 0, "tokens_lost": 120, "count": 1}]
    assert len(sv.top_breaks(recs)) == 4  # 4 groups
    many = [{"region": "r", "kind": "k", "token_offset": i, "tokens_lost": i} for i in range(12)]
    assert [b["token_offset"] for b in sv.top_breaks(many)] == list(range(11, 1, -1))  # default 10
    assert sv.top_breaks([{}]) == [{"field": "", "kind": "", "token_offset": 0, "tokens_lost": 0, "count": 1}]


def test_lengths_are_dense_over_the_edges() -> None:
    out = sv.lengths({"plen": {"0": 2, "10": 1}, "olen": {"3": 4}})
    assert out["prompt"]["edges"] == rollup.PROMPT_EDGES and out["output"]["edges"] == rollup.OUTPUT_EDGES
    assert out["prompt"]["counts"] == [2] + [0] * 9 + [1]
    assert out["output"]["counts"] == [0, 0, 0, 4, 0, 0, 0, 0, 0, 0]
    assert sv.lengths({})["prompt"]["counts"] == [0] * len(rollup.PROMPT_EDGES)


def _row(ts: float, **kw: object) -> LedgerRow:
    base: dict[str, object] = {
        "route": "r", "model": "claude-3-5-sonnet-20241022", "backend": "b", "status": "ok",
        "prompt_tokens": 2000, "cached_tokens": 1500, "cache_write_tokens": 100, "output_tokens": 20,
        "input_usd": 0.0012, "cf_input_usd": 0.006, "cf_cached_tokens": 0, "tokens_pruned": 0,
        "ttft_ms": 80.0, "tpot_ms": 9.0, "edits": "hoist_volatile"}
    base.update(kw)
    return LedgerRow(ts=ts, **base)  # type: ignore[arg-type]


def test_the_document_from_a_ledger_by_hand(tmp_path: Path) -> None:
    """Two requests in the last hour and one 2 h old: only the two count. Saved $0.0048 each
    -> $0.0096 of $0.012 = 80 %; 1500 cached of 2000 each -> 0.75; saved tokens 2 * 1500; the
    write premium 200 * 0.75 / 1e6."""
    led = Ledger(tmp_path / "l.sqlite")
    now = 1_800_000_000.0
    for ts in (now - 7200, now - 100, now - 10):
        led.write(_row(ts))
    doc = sv.savings_document(led, "1h", now=now)
    t = doc["totals"]
    assert (doc["from_ts"], doc["to_ts"], doc["bucket_s"]) == (int(now) + 1 - 3600, int(now) + 1, 60)
    assert t["requests"] == 2 and t["saved_usd"] == pytest.approx(0.0096, rel=1e-9)
    assert t["saved_pct"] == 0.8 and t["cached_share"] == 0.75 and t["saved_tokens"] == 3000
    assert t["cache_write_premium_usd"] == pytest.approx(0.00015, rel=1e-9)
    assert sum(doc["series"]["requests"]) == 2
    assert doc["routes"][0]["requests"] == 2 and doc["routes"][0]["cache_hit_rate"] == 1.0
    assert doc["slo"][0]["requests"] == 2 and doc["holdout"]["enabled"] is False
    assert [r["ts"] for r in sv.range_rows(led, now - 3600, now)] == [now - 100, now - 10]
    with pytest.raises(KeyError):
        sv.savings_document(led, "2h", now=now)
    led.close()


ROWS = st.lists(st.fixed_dictionaries({
    "prompt_tokens": st.integers(0, 100_000), "cached": st.integers(0, 100),
    "cf_cached": st.integers(0, 100), "pruned": st.integers(0, 5000),
    "input_usd": st.integers(0, 10_000), "saved_c": st.integers(0, 10_000)}), max_size=20)


def _fold(r: dict) -> dict:
    p = r["prompt_tokens"]
    return rollup.fold({"ts": 0, "prompt_tokens": p, "cached_tokens": p * r["cached"] // 100,
                        "cf_cached_tokens": p * r["cf_cached"] // 100, "tokens_pruned": r["pruned"],
                        "input_usd": r["input_usd"] / 1e6, "cf_input_usd": (r["input_usd"] + r["saved_c"]) / 1e6})


@settings(max_examples=100)
@given(ROWS)
def test_totals_add_up_over_rows(rows: list[dict]) -> None:
    """The totals' saved figures are the sums of each request's own saved figures."""
    data = rollup.total({"data": _fold(r)} for r in rows)
    t = sv.totals(data, [], None)
    per = [sv.totals(_fold(r), [], None) for r in rows]
    assert t["saved_tokens"] == sum(p["saved_tokens"] for p in per)
    if rows:
        assert t["saved_usd"] == pytest.approx(sum(p["saved_usd"] for p in per), abs=1e-7)
    assert t["requests"] == len(rows) and t["pruned_tokens"] == sum(r["pruned"] for r in rows)


@given(st.integers(0, 100_000), st.integers(0, 100_000), st.floats(0, 10))
def test_a_request_nothing_could_improve_reports_0_saved(prompt: int, cached: int, usd: float) -> None:
    """Sent as the client sent it (cf = actual, nothing pruned): 0 saved, in USD and tokens."""
    cached = min(cached, prompt)
    d = rollup.fold({"ts": 0, "prompt_tokens": prompt, "cached_tokens": cached, "cf_cached_tokens": cached,
                     "input_usd": usd, "cf_input_usd": usd, "edits": "none"})
    t = sv.totals(d, [], None)
    assert t["saved_usd"] == 0.0 and t["saved_tokens"] == 0 and t["cf_source"]["measured"] == 1


@given(ROWS.filter(bool), st.integers(0, 19), st.integers(1, 5000))
def test_saved_tokens_are_monotone_in_pruned_tokens(rows: list[dict], i: int, more: int) -> None:
    """Pruning more tokens on one request, all else equal, raises saved tokens by exactly that."""
    j = i % len(rows)
    before = sv.totals(rollup.total({"data": _fold(r)} for r in rows), [], None)["saved_tokens"]
    bumped = [dict(r, pruned=r["pruned"] + more) if k == j else r for k, r in enumerate(rows)]
    after = sv.totals(rollup.total({"data": _fold(r)} for r in bumped), [], None)["saved_tokens"]
    assert after == before + more
