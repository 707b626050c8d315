"""Per-minute rollups pinned to hand-computed numbers (issue 21): :mod:`prefixgate.cache.ledger.rollup`.

Every field of ``fold`` on small rows (the module docstring's table is the source of each
rule), ``merge``'s arithmetic, the histogram buckets at their edges, ``hist_percentile``
interpolation worked by hand, and ``upsert`` / ``read`` against a real SQLite table. Then the
properties: rollups add up (merging the folds of N rows gives the sums of the N rows, in any
order and grouping), and a bucketed count is monotone in what it counts.
"""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.ledger import rollup

ROW = {"ts": 125, "route": "r", "model": "m", "backend": "b", "status": "ok",
       "prompt_tokens": 3000, "cached_tokens": 2048, "cache_write_tokens": 500,
       "output_tokens": 40, "tokens_pruned": 120, "cf_cached_tokens": 1024,
       "input_usd": 0.0021, "cf_input_usd": 0.0021, "ttft_ms": 150.0, "tpot_ms": 12.0,
       "holdout": 0, "edits": "hoist_volatile", "pass_tokens": None}


def test_fold_of_a_full_row_field_by_field() -> None:
    """3000 prompt tokens fall in PROMPT_EDGES bucket 4 ([2048, 4096)); 40 output tokens in
    OUTPUT_EDGES bucket 2 ([32, 64)); TTFT 150 ms in latency bucket 23 ([1.25^22 = 135.525,
    169.407)); TPOT 12 ms in bucket 12 ([11.642, 14.552)). Rewritten (edits) with a
    counterfactual: modelled. No pass credited (``pass_tokens`` empty): the 2048 - 1024 = 1024
    tokens of cache reuse gained are the ``unattributed`` technique's (the parts add up to the
    saving, :mod:`prefixgate.cache.ledger.attribution`); no pass added tokens."""
    assert rollup.fold(ROW) == {
        "requests": 1, "errors": 0, "no_usage": 0, "holdout": 0,
        "prompt_tokens": 3000, "output_tokens": 40, "pruned_tokens": 120,
        "cf_source": {"modelled": 1},
        "usage_prompt": 3000, "cached_tokens": 2048, "cache_write_tokens": 500,
        "cf_prompt": 3000, "cf_cached_tokens": 1024, "cf_actual_cached": 2048,
        "priced": 1, "input_usd": 0.0021, "cf_input_usd": 0.0021,
        "ttft": {"23": 1}, "tpot": {"12": 1}, "plen": {"4": 1}, "olen": {"2": 1},
        "added_tokens": 0,
        "tech": {"unattributed": {"reusable": 1024, "removed": 0, "added": 0, "usd": None}},
    }


def test_fold_of_a_row_without_usage() -> None:
    """NULL usage counts as 0 in the token sums and once in ``no_usage``; no usage_prompt, no
    cf_* (no prompt to weigh them), not priced, no length buckets; an error counts once."""
    row = {"ts": 0, "status": "error", "prompt_tokens": None, "cached_tokens": 5,
           "output_tokens": None, "cf_cached_tokens": 3, "input_usd": 0.1, "cf_input_usd": None,
           "holdout": 1}
    assert rollup.fold(row) == {
        "requests": 1, "errors": 1, "no_usage": 1, "holdout": 1, "prompt_tokens": 0,
        "output_tokens": 0, "pruned_tokens": 0, "cf_source": {"holdout": 1}}


def test_fold_partial_usage() -> None:
    """Cached tokens reported without a cache-write figure: writes count 0; a counterfactual
    on a row with no cached figure: its actual cached count is 0; status missing means ok."""
    row = {"ts": 0, "prompt_tokens": 100, "cached_tokens": 64, "cf_cached_tokens": 10}
    d = rollup.fold(row)
    assert (d["errors"], d["usage_prompt"], d["cached_tokens"], d["cache_write_tokens"]) == (0, 100, 64, 0)
    assert (d["cf_prompt"], d["cf_cached_tokens"], d["cf_actual_cached"]) == (100, 10, 64)
    row2 = {"ts": 0, "prompt_tokens": 100, "cached_tokens": None, "cf_cached_tokens": 10}
    d2 = rollup.fold(row2)
    assert "usage_prompt" not in d2 and "cached_tokens" not in d2 and "cache_write_tokens" not in d2
    assert (d2["cf_prompt"], d2["cf_cached_tokens"], d2["cf_actual_cached"]) == (100, 10, 0)
    assert d2["plen"] == {"0": 1} and "olen" not in d2 and "ttft" not in d2 and "tpot" not in d2


def test_cf_source_of_each_path() -> None:
    """measured | modelled | holdout | none (cf_source_of's docstring)."""
    f = rollup.cf_source_of
    assert f({"cf_source": "measured", "holdout": 1}) == "measured"
    assert f({"cf_source": "bogus", "holdout": 1}) == "holdout"
    assert f({"cf_cached_tokens": None}) == "none"
    for sent in rollup.SENT_AS_IS:
        assert f({"cf_cached_tokens": 0, "edits": sent}) == "measured"
    assert f({"cf_cached_tokens": 0, "edits": None}) == "measured"
    assert f({"cf_cached_tokens": 0, "edits": "prune_tools"}) == "modelled"


def test_bucket_edges() -> None:
    """Bucket i is [edges[i], edges[i+1]): an edge belongs to the bucket it opens; below the
    first edge: bucket 0; past the last edge: the last (open) bucket."""
    e = [0, 10, 20, 40]
    assert [rollup.bucket(e, v) for v in (-5, 0, 9.99, 10, 19, 20, 39, 40, 10**9)] == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert rollup.bucket(rollup.PROMPT_EDGES, 1023) == 2 and rollup.bucket(rollup.PROMPT_EDGES, 1024) == 3


def test_merge_arithmetic() -> None:
    """Numbers add, objects merge recursively, None + x = x and x + None = x; returns ``a``."""
    a = {"n": 2, "h": {"1": 3}, "u": None, "k": 1.5}
    b = {"n": 5, "h": {"1": 1, "4": 2}, "u": 7, "k": None, "new": 9, "nul": None}
    out = rollup.merge(a, b)
    assert out is a
    assert a == {"n": 7, "h": {"1": 4, "4": 2}, "u": 7, "k": 1.5, "new": 9, "nul": None}


def test_hist_percentile_worked_by_hand() -> None:
    """edges [0, 10, 20, 40]; 2 requests in [0, 10), 2 in [10, 20): p50 -> target 2 reached
    at the end of bucket 0: 10.0; p75 -> target 3, 1 of bucket 1's 2: 10 + 10 * 1/2 = 15.0;
    p0 -> 0.0; p100 -> 20.0. The open last bucket reports its lower edge (40)."""
    e = [0.0, 10.0, 20.0, 40.0]
    h = {"0": 2, "1": 2}
    assert rollup.hist_percentile(h, 50, e) == 10.0
    assert rollup.hist_percentile(h, 75, e) == 15.0
    assert rollup.hist_percentile(h, 0, e) == 0.0
    assert rollup.hist_percentile(h, 100, e) == 20.0
    assert rollup.hist_percentile({"3": 4}, 50, e) == 40.0
    assert rollup.hist_percentile({}, 50, e) is None
    assert rollup.hist_percentile({"1": 0}, 50, e) is None
    # zero-count buckets are skipped, not read as the target: {0: 0, 2: 1}, p50 -> 20 + 20 * 0.5
    assert rollup.hist_percentile({"0": 0, "2": 1}, 50, e) == 30.0
    # keys are bucket numbers, ordered as numbers ("10" after "2")
    e12 = [float(i * 10) for i in range(12)]
    assert rollup.hist_percentile({"10": 1, "2": 1}, 50, e12) == 30.0
    assert rollup.hist_percentile({"10": 1, "2": 1}, 100, e12) == 110.0


def test_counts_over_is_dense_and_drops_out_of_range() -> None:
    assert rollup.counts_over({"0": 2, "3": 1, "9": 4, "-1": 5}, 4) == [2, 0, 0, 1]
    assert rollup.counts_over({}, 2) == [0, 0]


def test_upsert_and_read_against_sqlite() -> None:
    """One row per (minute, route, model, backend); ts 60..119 share minute 60; ``read``
    floors from_ts to its minute and excludes ``to_ts``'s minute onward."""
    db = sqlite3.connect(":memory:")
    rollup.create(db)
    rollup.create(db)  # idempotent
    base = {"route": "r", "model": "m", "backend": "b", "prompt_tokens": 10, "cached_tokens": 4}
    rollup.upsert(db, {**base, "ts": 60})
    rollup.upsert(db, {**base, "ts": 119.9})
    rollup.upsert(db, {**base, "ts": 120})
    rollup.upsert(db, {**base, "ts": 61, "route": "other"})
    rows = rollup.read(db, 61, 120)
    assert sorted((r["minute"], r["route"]) for r in rows) == [(60, "other"), (60, "r")]
    r60 = next(r for r in rows if r["route"] == "r")
    assert (r60["data"]["requests"], r60["data"]["prompt_tokens"], r60["data"]["cached_tokens"]) == (2, 20, 8)
    assert [r["minute"] for r in rollup.read(db, 0, 10_000)][-1] == 120  # oldest first
    assert {r["minute"] for r in rollup.read(db, 0, 10_000)} == {60, 120}
    assert rollup.read(db, 121, 180)[0]["minute"] == 120
    # no route / model / backend: stored as ""
    rollup.upsert(db, {"ts": 300, "prompt_tokens": 1})
    assert [(r["route"], r["model"], r["backend"]) for r in rollup.read(db, 300, 360)] == [("", "", "")]


def test_total_merges_every_row() -> None:
    rows = [{"data": rollup.fold({**ROW, "ts": t})} for t in (0, 60, 120)]
    t = rollup.total(rows)
    assert (t["requests"], t["prompt_tokens"], t["cached_tokens"], t["plen"]) == (3, 9000, 6144, {"4": 3})
    assert abs(t["input_usd"] - 0.0063) < 1e-15 and t["priced"] == 3


ROWS = st.lists(st.fixed_dictionaries({
    "ts": st.integers(0, 600),
    "status": st.sampled_from(["ok", "error", None]),
    "prompt_tokens": st.none() | st.integers(0, 200_000),
    "cached_tokens": st.none() | st.integers(0, 5000),
    "output_tokens": st.none() | st.integers(0, 5000),
    "tokens_pruned": st.none() | st.integers(0, 5000),
    "cf_cached_tokens": st.none() | st.integers(0, 5000),
    "ttft_ms": st.none() | st.floats(0, 1e6),
    "holdout": st.sampled_from([0, 1]),
}), max_size=25)


@settings(max_examples=150)
@given(ROWS, st.randoms())
def test_rollups_add_up_in_any_grouping(rows: list[dict], rnd) -> None:  # type: ignore[no-untyped-def]
    """Totals add up: the merged folds hold the plain sums of the rows, whatever the order
    and grouping of the merges (per minute, then over minutes)."""
    one = rollup.total({"data": rollup.fold(r)} for r in rows)
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    by_min: dict[int, dict] = {}
    for r in shuffled:
        rollup.merge(by_min.setdefault(r["ts"] // 60, {}), rollup.fold(r))
    two = rollup.total({"data": d} for d in by_min.values())
    assert one == two
    assert one.get("requests", 0) == len(rows)
    assert one.get("errors", 0) == sum(1 for r in rows if (r["status"] or "ok") != "ok")
    assert one.get("no_usage", 0) == sum(1 for r in rows if r["prompt_tokens"] is None)
    assert one.get("prompt_tokens", 0) == sum(r["prompt_tokens"] or 0 for r in rows)
    assert one.get("cached_tokens", 0) == sum(r["cached_tokens"] for r in rows
                                              if r["prompt_tokens"] is not None and r["cached_tokens"] is not None)
    assert one.get("pruned_tokens", 0) == sum(r["tokens_pruned"] or 0 for r in rows
                                              if r["prompt_tokens"] is not None)
    assert sum(one.get("cf_source", {}).values()) == len(rows)
    assert sum(one.get("plen", {}).values()) == sum(1 for r in rows if r["prompt_tokens"] is not None)
    assert sum(one.get("ttft", {}).values()) == sum(1 for r in rows if r["ttft_ms"] is not None)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=30), st.floats(0, 100), st.floats(0, 100))
def test_hist_percentile_is_monotone_in_p(xs: list[float], p: float, q: float) -> None:
    """A higher percentile never reads lower; it stays within the histogram's buckets."""
    h: dict[str, int] = {}
    for x in xs:
        k = str(rollup.bucket(rollup.LAT_EDGES_MS, x))
        h[k] = h.get(k, 0) + 1
    lo, hi = sorted((p, q))
    a, b = rollup.hist_percentile(h, lo), rollup.hist_percentile(h, hi)
    assert a is not None and b is not None and a <= b
    first = min(int(k) for k in h)
    assert a >= rollup.LAT_EDGES_MS[first]


# ---- issue 21, round two -------------------------------------------------------------------------

def test_an_explicit_cf_source_wins_over_the_row_flags() -> None:
    assert rollup.cf_source_of({"cf_source": "modelled", "holdout": True}) == "modelled"
    assert rollup.cf_source_of({"cf_source": "holdout", "cf_cached_tokens": 5, "edits": "x"}) == "holdout"
    assert rollup.cf_source_of({"cf_source": "measured", "holdout": True}) == "measured"


def test_counts_over_adds_same_index_keys_and_drops_out_of_range() -> None:
    assert rollup.counts_over({"1": 2, "01": 3, "3": 7, "-1": 4}, 3) == [0, 5, 0]


def test_hist_percentile_walks_the_running_count_and_past_100_reports_the_last_edge() -> None:
    e = rollup.LAT_EDGES_MS
    assert rollup.hist_percentile({"0": 1, "1": 1, "2": 1}, 100) == e[3]  # 2 seen before bucket 2
    assert rollup.hist_percentile({"0": 1, "1": 1, "3": 2}, 150) == float(e[3])


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    rollup.create(db)
    return db


def test_each_key_field_keeps_its_own_rollup_row() -> None:
    db = _db()
    base = {"ts": 60, "route": "r", "model": "a", "backend": "x", "tenant": "t1", "status": "ok"}
    for row in (base, {**base, "model": "b"}, {**base, "backend": "y"}, {**base, "tenant": "t2"},
                {**base, "tenant": None}, base):
        rollup.upsert(db, row)
    got = sorted((r["model"], r["backend"], r["tenant"], r["data"]["requests"]) for r in rollup.read(db, 0, 999))
    assert got == [("a", "x", "", 1), ("a", "x", "t1", 2), ("a", "x", "t2", 1), ("a", "y", "t1", 1),
                   ("b", "x", "t1", 1)]


def test_reading_one_tenant_keeps_its_sub_tenants_only() -> None:
    db = _db()
    for t in ("acme", "acme/team", "acme2", "other", ""):
        rollup.upsert(db, {"ts": 60, "route": "r", "tenant": t, "status": "ok"})
    assert sorted(r["tenant"] for r in rollup.read(db, 0, 999, tenant="acme")) == ["acme", "acme/team"]
    assert sorted(r["tenant"] for r in rollup.read(db, 0, 999, tenant="acme/team")) == ["acme/team"]
    assert len(rollup.read(db, 0, 999)) == 5
