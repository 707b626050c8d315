"""Attribution that adds up (issue 19, item 5), unit level: per row and summed, the parts —
the named remainder included — equal the whole, in tokens and in USD."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.attribution import (
    UNATTRIBUTED,
    attribute_usd,
    by_technique,
    parse_pass_tokens,
    row_techniques,
)
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.report import saved_figures
from prefixgate.cache.savings.summary import savings_document
from prefixgate.config.prices import price_for

PASSES = {"prune_rag": {"reusable": 0, "removed": 1000, "added": 0},
          "hoist_volatile": {"reusable": 3000, "removed": 0, "added": 50},
          "place_breakpoints": {"reusable": 1000, "removed": 0, "added": 0}}


def _row(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "gpt-4o", "prompt_tokens": 9050, "cached_tokens": 6000,
                            "cf_cached_tokens": 1500, "input_usd": 0.010, "cf_input_usd": 0.030,
                            "tokens_pruned": 1000, "pass_tokens": json.dumps(PASSES)}
    base.update(kw)
    return base


def _saved(t: dict[str, Any]) -> int:
    return int(t["reusable"]) + int(t["removed"]) - int(t["added"])


def test_the_parts_of_a_row_are_its_whole_saving_with_the_remainder_named() -> None:
    row = _row()
    tech = row_techniques(row)
    whole = (6000 - 1500) + 1000 - 50                      # reuse + pruned - added
    assert sum(_saved(t) for t in tech.values()) == whole
    assert tech[UNATTRIBUTED]["reusable"] == (6000 - 1500) - 4000
    assert tech[UNATTRIBUTED]["removed"] == tech[UNATTRIBUTED]["added"] == 0
    assert sum(t["usd"] for t in tech.values()) == pytest.approx(0.020)
    p = price_for("gpt-4o")
    assert p is not None
    assert tech["hoist_volatile"]["usd"] == pytest.approx(
        (3000 * (p.input - p.cached_input) - 50 * p.input) / 1e6)
    assert tech["prune_rag"]["usd"] == pytest.approx(1000 * 0.030 / (9050 + 1000 - 50))
    # nothing to name when the credits are the whole reuse
    exact = row_techniques(_row(cached_tokens=5500))
    assert UNATTRIBUTED not in exact or exact[UNATTRIBUTED]["reusable"] == 0


def test_a_row_without_a_counterfactual_credits_no_reuse_and_unpriced_rows_no_usd() -> None:
    tech = row_techniques(_row(cf_cached_tokens=None, cf_input_usd=None))
    # the totals count no reuse without a counterfactual: the credits are taken back, named
    assert sum(_saved(t) for t in tech.values()) == 1000 - 50
    assert all(t["usd"] is None for t in tech.values())
    assert attribute_usd(PASSES, _row(prompt_tokens=None)) is None
    assert attribute_usd(PASSES, _row(input_usd=None)) is None
    # priced both ways but the model has no list price: the whole saving, unattributed
    assert attribute_usd(PASSES, _row(model="no-such-model")) == {
        UNATTRIBUTED: pytest.approx(0.020)}
    assert attribute_usd({}, _row(input_usd=0.01, cf_input_usd=0.01)) == {}


def test_by_technique_sums_rows_and_puts_the_remainder_last() -> None:
    rows = [_row(), _row(cached_tokens=1500, pass_tokens="")]   # 2nd: no pass, no saving
    figs = by_technique(rows)
    assert figs[-1].technique == UNATTRIBUTED
    assert sum(f.saved_tokens for f in figs) == (6000 - 1500) + 1000 - 50
    d = {f.technique: f.to_dict() for f in figs}
    assert d["hoist_volatile"]["saved_tokens"] == 3000 - 50
    assert parse_pass_tokens('{"x": {"reusable": "n"}}') == {}
    assert parse_pass_tokens("[1]") == {} and parse_pass_tokens(None) == {}


def test_ledger_report_and_api_totals_equal_the_sum_of_their_parts(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    t0 = 1_800_000_000.0
    credits = [(3000, 1000), (-200, 0), (0, 0)]
    for i, (hoist, bp) in enumerate(credits):
        passes = {"hoist_volatile": {"reusable": hoist, "removed": 0, "added": 50},
                  "place_breakpoints": {"reusable": bp, "removed": 0, "added": 0},
                  "prune_rag": {"reusable": 0, "removed": 100 * i, "added": 0}}
        led.write(LedgerRow(ts=t0 + i, route="r", model="gpt-4o", backend="b",
                            prompt_tokens=9000, cached_tokens=5000 - 100 * i,
                            cf_cached_tokens=1000, input_usd=0.01, cf_input_usd=0.02 + i / 1e3,
                            tokens_pruned=100 * i, pass_tokens=json.dumps(passes),
                            edits="hoist_volatile", cf_source="modelled"))
    led.write(LedgerRow(ts=t0 + 5, route="r", model="gpt-4o", backend="b", prompt_tokens=100,
                        cached_tokens=0, cf_cached_tokens=0, input_usd=1e-4, cf_input_usd=1e-4,
                        edits="none", cf_source="measured"))
    rows = led.rows()
    want = sum(5000 - 100 * i - 1000 for i in range(3)) + 300 - 150
    s = saved_figures(rows)
    assert s["saved_tokens"] == want and s["added_tokens"] == 150
    assert sum(t.saved_tokens for t in by_technique(rows)) == want
    doc = savings_document(led, "1h", now=t0 + 60)
    assert doc["totals"]["saved_tokens"] == want and doc["totals"]["added_tokens"] == 150
    assert sum(t["saved_tokens"] for t in doc["by_technique"]) == want
    assert sum(t["usd"] for t in doc["by_technique"]) == pytest.approx(doc["totals"]["saved_usd"])
    tech = {t["technique"]: t for t in doc["by_technique"]}
    assert tech["hoist_volatile"]["tokens_reusable"] == 2800          # signed credits add
    assert tech[UNATTRIBUTED]["tokens_reusable"] == want - 300 + 150 - 2800 - 1000
    led.close()
