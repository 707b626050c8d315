"""The ``/api/savings`` figures pinned to hand-computed numbers (issue 21): :mod:`prefixgate.cache.savings.summary`.

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

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings import summary as sv
from prefixgate.cache.savings import top_break as tb
from prefixgate.cache.savings.holdout_stats import holdout_report
from prefixgate.config.schema import HoldoutSettings, Slo, SloSettings


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
        "cache_write_premium_usd": 0.00003, "holdout_requests": 1, "span_reused_tokens": 0}


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


def test_breaks_group_by_cause_sum_and_sort_by_tokens_lost() -> None:
    recs = [{"region": "system", "kind": "edit", "token_offset": 10, "tokens_lost": 100},
            {"region": "system", "kind": "edit", "token_offset": 12, "tokens_lost": 50},
            {"region": "tools", "kind": "reorder", "token_offset": 0, "tokens_lost": 120},
            {"region": "msgs", "kind": "edit", "token_offset": 5, "tokens_lost": 120},
            {"region": "msgs", "kind": "edit", "token_offset": 5},
            {"region": "x", "kind": "y", "token_offset": 1, "tokens_lost": 1}]
    out = tb.explain_breaks(recs, [], limit=3)
    assert [(b["field"], b["kind"], b["token_offset"], b["token_offset_max"], b["tokens_lost"],
             b["count"]) for b in out] == [("system", "edit", 10, 12, 150, 2),
                                           ("msgs", "edit", 5, 5, 120, 2),
                                           ("tools", "reorder", 0, 0, 120, 1)]
    assert len(tb.explain_breaks(recs, [])) == 4  # 4 causes
    many = [{"region": "r", "kind": "k", "detail": str(i), "token_offset": i, "tokens_lost": i}
            for i in range(12)]
    assert [b["token_offset"] for b in tb.explain_breaks(many, [])] == list(range(11, 1, -1))


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


def _ledger_row(**kw: object) -> dict:
    """A row as :func:`prefixgate.cache.savings.summary.range_rows` returns it: every column, None unless given."""
    return {**dict.fromkeys(sv.ROW_COLUMNS), "status": "ok", **kw}


def _rolls(rows: list[dict]) -> list[dict]:
    """One rollup per row (its own minute), keyed as the ledger keys them ("" for a missing name)."""
    return [{"minute": 60 * i, "route": r["route"] or "", "model": r["model"] or "", "backend": r["backend"] or "",
             "data": rollup.fold({"ts": 60 * i, **r})} for i, r in enumerate(rows)]


def test_routes_table_by_hand() -> None:
    """Route r1 on backend b1 serves two models. m1: rows a (1000 prompt, 0 cached, prefill 500
    ms), b (2000 prompt, 1000 cached, 200 counterfactual, prefill 200 ms), c (errored, no usage).
    (r1, b1)'s prefill rate: two samples of 1000 uncached tokens (one x: no slope) -> ratio
    700 / 2000 = 0.35 ms per token. m1: cached share 1000 / 3000; hit rate 1 of the 2 reporting;
    saved $0.0060000123 - $0.003 -> $0.00300001 (8 places). With prefill times 500 and 200.2468
    ms the rate is 700.2468 / 2000 = 0.3501234 ms per token: prefill saved (1000 - 200) x that =
    0.28009872 s, cached 1000 x that = 0.3501234 s, at $36 an hour 0.28009872 / 100 =
    $0.0028009872. m2 (no prefill time of its own) uses the route's rate: 100 cached, 0
    counterfactual -> 0.03501234 s, $0.0003501234. The unnamed route / backend ("-", "-") has
    its own rate 100 ms / 100 tokens = 1 ms per token. Timings keep 3 decimals."""
    a = _ledger_row(route="r1", model="m1", backend="b1", prompt_tokens=1000, cached_tokens=0, cf_cached_tokens=0,
                    input_usd=0.003, cf_input_usd=0.003, output_tokens=5, ttft_ms=100.1234, tpot_ms=10.5678,
                    queue_ms=1.23456, prefill_ms=500.0, decode_ms=40.1111)
    b = _ledger_row(route="r1", model="m1", backend="b1", prompt_tokens=2000, cached_tokens=1000, cf_cached_tokens=200,
                    input_usd=0.003, cf_input_usd=0.0060000123, output_tokens=50, ttft_ms=200.1234, tpot_ms=20.5678,
                    queue_ms=2.23456, prefill_ms=200.2468, decode_ms=50.1111)
    c = _ledger_row(route="r1", model="m1", backend="b1", status="upstream_error", ttft_ms=400.1234,
                    tpot_ms=30.5678, queue_ms=4.23456, decode_ms=70.1111, stood_back="stabilise,hoist: slower")
    d = _ledger_row(route="r1", model="m2", backend="b1", prompt_tokens=500, cached_tokens=100, cf_cached_tokens=0)
    e = _ledger_row(prompt_tokens=100, cached_tokens=0, prefill_ms=100.0)
    bare = {"minute": 0, "route": "r9", "model": "m9", "backend": "b9", "data": {}}  # a rollup with no rows
    out = sv.routes_table([*_rolls([a, b, c, d, e]), bare], [a, b, c, d, e], {"b1": 36.0})
    assert [(t["route"], t["model"], t["backend"]) for t in out] == [(sv.NO_ROUTE, "", ""), ("r1", "m1", "b1"),
                                                                      ("r1", "m2", "b1"), ("r9", "m9", "b9")]
    none, m1, m2, r9 = out
    assert (r9["requests"], r9["errors"], r9["cache_hit_rate"], r9["ttft_p50_ms"], r9["stood_back"],
            r9["saved_usd"]) == (0, 0, None, None, None, None)
    assert {k: v for k, v in m1.items() if k != "lengths"} == {
        "route": "r1", "model": "m1", "backend": "b1", "requests": 3, "errors": 1,
        "cached_share": 0.333333, "cache_hit_rate": 0.5, "saved_usd": 0.00300001,
        "ttft_p50_ms": 200.123, "ttft_p95_ms": 380.123, "tpot_p50_ms": 20.568, "queue_ms_p50": 2.235,
        "prefill_ms_p50": 350.123, "decode_ms_p50": 50.111,
        "prefill_ms_per_token": 0.350123, "prefill_rate_method": "ratio", "prefill_rate_samples": 2,
        "prefill_s_saved": 0.280099, "prefill_s_cached": 0.350123, "prefill_usd_saved": 0.00280099,
        "ttft_s_saved_holdout": None, "rows_with_rate": 2,
        "stood_back": {"requests": 1, "passes": ["hoist", "stabilise"], "reason": "slower"},
        "pd": None, "pd_split_share": None}
    assert m1["lengths"]["prompt"]["counts"] == sv.lengths(rollup.total({"data": r["data"]} for r in _rolls([a, b, c])))["prompt"]["counts"]
    assert sum(m1["lengths"]["prompt"]["counts"]) == 2 and sum(m1["lengths"]["output"]["counts"]) == 2
    assert (m2["requests"], m2["errors"], m2["saved_usd"], m2["cache_hit_rate"]) == (1, 0, None, 1.0)
    assert (m2["prefill_ms_per_token"], m2["prefill_s_saved"], m2["prefill_s_cached"],
            m2["prefill_usd_saved"], m2["stood_back"]) == (0.350123, 0.035012, 0.035012, 0.00035012, None)
    assert (none["requests"], none["prefill_ms_per_token"], none["prefill_rate_samples"],
            none["prefill_s_cached"], none["prefill_usd_saved"], none["ttft_p50_ms"]) == (1, 1.0, 1, 0.0, None, None)
    assert sv.routes_table(_rolls([a]), [a])[0]["prefill_usd_saved"] is None  # no hourly price given


def test_stood_back_of_counts_marked_rows_and_takes_the_latest_reason() -> None:
    rows = [{"stood_back": "b,a: first"}, {"stood_back": ""}, {}, {"stood_back": None},
            {"stood_back": "c,,a: the latest: with a colon"}]
    assert sv.stood_back_of(rows) == {"requests": 2, "passes": ["a", "b", "c"],
                                      "reason": "the latest: with a colon"}
    assert sv.stood_back_of([{"stood_back": ""}]) is None and sv.stood_back_of([]) is None


def test_replicas_table_by_hand() -> None:
    """Replica a: 3 rows, one errored, cached 300 + 100 of 1000 + 3000 prompt tokens reporting
    both (the third has no cached figure) -> 0.1; TTFT p50 of 10, 30 (one unknown) = 20; last ts
    103. Replica b: one row, nothing reported. Rows without a replica count under "-"."""
    rows = [_ledger_row(replica="a", ts=101.0, prompt_tokens=1000, cached_tokens=300, ttft_ms=10.1234),
            _ledger_row(replica="a", ts=103.0, prompt_tokens=3000, cached_tokens=100, ttft_ms=30.1234),
            _ledger_row(replica="a", ts=102.0, prompt_tokens=500, status="timeout"),
            _ledger_row(replica="b", ts=99.0, status=None),
            _ledger_row(replica=None, ts=None, cached_tokens=5)]
    assert sv.replicas_table(rows) == [
        {"replica": "-", "requests": 1, "errors": 0, "cached_share": None, "ttft_p50_ms": None, "last_ts": 0.0},
        {"replica": "a", "requests": 3, "errors": 1, "cached_share": 0.1, "ttft_p50_ms": 20.123, "last_ts": 103.0},
        {"replica": "b", "requests": 1, "errors": 0, "cached_share": None, "ttft_p50_ms": None, "last_ts": 99.0}]
    assert sv.replicas_table([_ledger_row(replica="z", ts=5.0, prompt_tokens=0, cached_tokens=0)])[0]["cached_share"] is None


def test_the_document_of_a_tenant_over_24h_by_hand(tmp_path: Path) -> None:
    """Tenant t1 (its sub-tenant t1/sub included; t2 and a 2-day-old row left out), 24 h in
    5-minute buckets. Row a: 1500 of 2000 cached where the client's body would have cached 0,
    $0.0012 paid of $0.006, prefill 100 ms for 500 uncached; row b (holdout, t1/sub): nothing
    cached, $0.006 both ways, prefill 400 ms for 2000 uncached. Route rate: ratio 500 / 2500 =
    0.2 ms per token -> prefill saved 1500 * 0.2 ms = 0.3 s, at $36 an hour $0.003. Saved $0.0048
    of $0.012 = 40 %; saved tokens 1500. SLO 100 ms / 5 ms: TTFTs 80, 120 -> 1/2; TPOTs 9, 3 -> 1/2;
    goodput 0 (a misses TPOT, b TTFT). t1's one break of 40 tokens; t2's is not shown."""
    led = Ledger(tmp_path / "l.sqlite")
    now = time.time()
    common = {"route": "r", "model": "claude-3-5-sonnet-20241022", "backend": "b", "status": "ok",
              "prompt_tokens": 2000, "cf_cached_tokens": 0, "cf_input_usd": 0.006, "output_tokens": 20}
    led.write(LedgerRow(ts=now - 100, tenant="t1", replica="p1", cached_tokens=1500, input_usd=0.0012,
                        prefill_ms=100.0, ttft_ms=80.0, tpot_ms=9.0, **common))  # type: ignore[arg-type]
    led.write(LedgerRow(ts=now - 50, tenant="t1/sub", replica="p2", cached_tokens=0, input_usd=0.006,
                        prefill_ms=400.0, ttft_ms=120.0, tpot_ms=3.0, holdout=True, **common))  # type: ignore[arg-type]
    led.write(LedgerRow(ts=now - 60, tenant="t2", cached_tokens=2000, input_usd=0.0001, **common))  # type: ignore[arg-type]
    led.write(LedgerRow(ts=now - 2 * 86400, tenant="t1", cached_tokens=2000, input_usd=0.0001, **common))  # type: ignore[arg-type]
    led.write_break("s1", {"region": "system", "kind": "edit", "token_offset": 3, "tokens_lost": 40}, "t1")
    led.write_break("s2", {"region": "tools", "kind": "edit", "token_offset": 0, "tokens_lost": 900}, "t2")
    slo = SloSettings(routes={"r": Slo(ttft_ms=100.0, tpot_ms=5.0)})
    doc = sv.savings_document(led, "24h", slo=slo, holdout=HoldoutSettings(fraction=0.25, seed=3),
                              usd_per_hour={"b": 36.0}, tenant="t1")
    assert (doc["range"], doc["bucket_s"], doc["to_ts"] - doc["from_ts"]) == ("24h", 300, 86400)
    assert int(now) + 1 <= doc["to_ts"] <= int(time.time()) + 1  # ends now (the clock moved on)
    t = doc["totals"]
    assert (t["requests"], t["holdout_requests"], t["saved_tokens"], t["saved_pct"]) == (2, 1, 1500, 0.4)
    assert t["saved_usd"] == pytest.approx(0.0048, rel=1e-9)
    assert (t["prefill_s_saved"], t["prefill_s_cached"], t["prefill_usd_saved"]) == (0.3, 0.3, 0.003)
    assert [(b["saved_tokens"], b["technique"]) for b in doc["by_technique"]] == [(1500, "unattributed")]
    assert doc["by_technique"][0]["usd"] == pytest.approx(0.0048, rel=1e-9)
    h = doc["holdout"]
    assert (h["enabled"], h["fraction"], h["verdict"]) == (True, 0.25, "inconclusive")
    assert (h["overall"]["n_rewritten"], h["overall"]["n_holdout"]) == (1, 1) and h["reason"]
    assert [b["bucket"] for b in h["buckets"]] == [b["bucket"] for b in holdout_report(led.rows(), 3)["buckets"]]
    assert sum(doc["series"]["requests"]) == 2 and doc["series"]["ts"][0] == doc["from_ts"] // 300 * 300
    assert doc["slo"] == [{"route": "r", "ttft_ms": 100.0, "tpot_ms": 5.0, "requests": 2, "n_ttft": 2, "n_tpot": 2,
                           "ttft_attainment": 0.5, "tpot_attainment": 0.5, "goodput": 0.0}]
    assert sum(doc["lengths"]["prompt"]["counts"]) == 2 and sum(doc["lengths"]["output"]["counts"]) == 2
    assert [{k: b[k] for k in ("field", "kind", "token_offset", "tokens_lost", "count")}
            for b in doc["breaks"]] == [{"field": "system", "kind": "edit", "token_offset": 3,
                                         "tokens_lost": 40, "count": 1}]
    assert [(r["route"], r["requests"], r["prefill_usd_saved"]) for r in doc["routes"]] == [("r", 2, 0.003)]
    assert [(r["replica"], r["requests"]) for r in doc["replicas"]] == [("p1", 1), ("p2", 1)]
    every = sv.savings_document(led, "24h")  # no tenant: t2 counts; no hourly price: no USD figure
    assert every["totals"]["requests"] == 3 and every["totals"]["prefill_usd_saved"] is None
    assert len(every["breaks"]) == 2 and every["holdout"]["enabled"] is False
    assert every["slo"][0]["ttft_ms"] == 2000.0  # the default SLO
    last_hour = sv.savings_document(led)  # the default range: 1 h, ending now
    assert (last_hour["range"], last_hour["bucket_s"], last_hour["totals"]["requests"]) == ("1h", 60, 3)
    led.close()


def test_totals_of_nothing_are_zero_counts_and_null_money() -> None:
    """A range without requests: every count 0, every USD figure and share None (not 0)."""
    assert sv.totals({}, [], None) == {
        "requests": 0, "errors": 0, "input_usd": None, "cf_input_usd": None, "saved_usd": None,
        "saved_pct": None, "prompt_tokens": 0, "cached_tokens": 0, "cf_cached_tokens": 0, "saved_tokens": 0,
        "pruned_tokens": 0, "added_tokens": 0, "cached_share": None, "cf_cached_share": None,
        "ttft_p50_ms": None, "ttft_p95_ms": None,
        "cf_source": {"measured": 0, "modelled": 0, "holdout": 0, "none": 0}, "no_usage_reported": 0,
        "output_tokens": 0, "cache_write_tokens": 0, "cache_write_premium_usd": None, "holdout_requests": 0,
        "span_reused_tokens": 0}


def test_totals_keep_8_decimals_of_dollars_and_3_of_milliseconds_and_subtract_added_tokens() -> None:
    """$0.0012345678912 paid of $0.0061234567891 -> saved $0.0048888888979: each to 8 places.
    Saved tokens: reuse 900 + pruned 250 - 30 a pass added (a hoisted note) = 1120. TTFT p50 of
    100.12345, 200.12345, 300.12345 = 200.123; p95 = 200.12345 + 0.9 x 100 = 290.123."""
    data = {"priced": 1, "input_usd": 0.0012345678912, "cf_input_usd": 0.0061234567891,
            "cf_actual_cached": 1500, "cf_cached_tokens": 600, "pruned_tokens": 250, "added_tokens": 30}
    rows = [{"ttft_ms": 100.12345}, {"ttft_ms": 300.12345}, {"ttft_ms": 200.12345}]
    t = sv.totals(data, rows, 0.0000123456789)
    assert (t["input_usd"], t["cf_input_usd"], t["saved_usd"]) == (0.00123457, 0.00612346, 0.00488889)
    assert t["saved_pct"] == 0.798387  # 0.0048888888979 / 0.0061234567891
    assert t["cache_write_premium_usd"] == 0.00001235
    assert (t["saved_tokens"], t["added_tokens"]) == (1120, 30)
    assert (t["ttft_p50_ms"], t["ttft_p95_ms"]) == (200.123, 290.123)


def test_series_keeps_8_decimals_of_dollars_and_3_of_tpot_percentiles() -> None:
    """Saved $0.0060000123 - $0.003 = $0.00300001; a TPOT histogram of 2 requests in bucket 3
    and 1 in bucket 5 (:data:`prefixgate.cache.ledger.rollup.LAT_EDGES_MS`) has p50 1.85525 -> 1.855."""
    d = {"requests": 3, "priced": 1, "input_usd": 0.003, "cf_input_usd": 0.0060000123,
         "tpot": {"3": 2, "5": 1}}
    s = sv.series(0, [d], 60)
    assert s["saved_usd"] == [0.00300001]
    exact = [rollup.hist_percentile({"3": 2, "5": 1}, p) for p in (50, 95, 99)]
    assert exact[0] == pytest.approx(1.85525)
    assert s["tpot_ms"] == {"p50": [round(exact[0], 3)], "p95": [round(exact[1], 3)], "p99": [round(exact[2], 3)]}
    assert s["tpot_ms"]["p50"] != [round(exact[0], 4)] and s["ttft_ms"]["p50"] == [None]


def test_an_slo_met_exactly_is_met() -> None:
    """SLO 100 ms / 10 ms: a request at exactly 100 ms TTFT and 10 ms TPOT attains both and counts
    in goodput."""
    slo = SloSettings(routes={"t": Slo(ttft_ms=100.0, tpot_ms=10.0)})
    out = sv.slo_table([{"route": "t", "ttft_ms": 100.0, "tpot_ms": 10.0}], slo)
    assert (out[0]["ttft_attainment"], out[0]["tpot_attainment"], out[0]["goodput"]) == (1.0, 1.0, 1.0)


def test_write_premium_skips_an_unpriced_model_and_goes_on() -> None:
    rolls = [{"model": "no-such-model", "data": {"cache_write_tokens": 5}},
             {"model": "claude-3-5-sonnet-20241022", "data": {"cache_write_tokens": 2000}}]
    assert sv.write_premium(rolls) == pytest.approx(0.0015, rel=1e-12)  # 2000 x $0.75 / 1e6


def test_the_holdout_comparison_uses_the_policys_seed(tmp_path: Path) -> None:
    """Two arms of 25 requests (past MIN_PER_ARM): the bootstrap interval is the one drawn with
    the policy's seed, so the same ledger gives the same figures on every read."""
    led = Ledger(tmp_path / "l.sqlite")
    now = 1_800_000_000.0
    for i in range(50):
        led.write(LedgerRow(ts=now - 1000 + i, route="r", model="m", status="ok", prompt_tokens=500 + 7 * i,
                            cached_tokens=(i * 37) % 400, ttft_ms=100.0 + (i * 13) % 50, holdout=i % 2 == 1))
    rows = sv.range_rows(led, now + 1 - 3600, now + 1)
    doc = sv.savings_document(led, "1h", holdout=HoldoutSettings(fraction=0.5, seed=3), now=now)
    seeded, other = holdout_report(rows, 3), holdout_report(rows, 0)
    assert seeded["overall"] != other["overall"]  # the seed matters for this sample
    assert doc["holdout"]["overall"] == seeded["overall"] and doc["holdout"]["buckets"] == seeded["buckets"]
    assert (doc["holdout"]["verdict"], doc["holdout"]["reason"]) == (seeded["verdict"], seeded["reason"])
    led.close()


def test_the_routes_table_keeps_the_busiest_keys_and_sums_the_rest_into_one_row() -> None:
    """Issue 34 item 16: model names are the client's; 3,000 of them made 3,010 route rows. The
    table holds the ROUTES_TOP busiest (route, model, backend) keys and one ``(other)`` row whose
    counts are the rest's sums, so every request is still counted once."""
    rows = [_ledger_row(route="r", model=f"m{i:03d}", backend="b", prompt_tokens=100, cached_tokens=10 * (i % 3),
                        ttft_ms=float(i)) for i in range(sv.ROUTES_TOP + 70) for _ in range(1 + (i % 2))]
    out = sv.routes_table(_rolls(rows), rows)
    assert len(out) == sv.ROUTES_TOP + 1
    *top, other = out
    assert (other["route"], other["model"], other["backend"]) == (sv.OTHER,) * 3
    assert other["other_keys"] == 70 and all("other_keys" not in t for t in top)
    assert sum(t["requests"] for t in out) == len(rows)                 # nothing lost, nothing twice
    assert {t["requests"] for t in top} == {2}                          # the busiest keys have rows
    assert [t["model"] for t in top] == sorted(t["model"] for t in top)
    rest = [r for r in rows if r["model"] not in {t["model"] for t in top}]
    assert other["cached_share"] == round(sum(r["cached_tokens"] for r in rest) / (100 * len(rest)), 6)
    assert other["ttft_p50_ms"] is not None
    few = sv.routes_table(_rolls(rows[:4]), rows[:4])                    # under the cap: as before
    assert all("other_keys" not in t for t in few) and len(few) == 3
