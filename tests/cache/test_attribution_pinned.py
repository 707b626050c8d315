"""Savings by technique, pinned by hand (issue 21): :mod:`prefixgate.cache.ledger.attribution` on small
rows whose every figure is computed below from the module docstring's rules (gpt-4o list
prices: input $2.50 / M, cached input $1.25 / M)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixgate.cache.ledger.attribution import (
    UNATTRIBUTED,
    TechniqueFigures,
    added_tokens,
    attribute_usd,
    by_technique,
    merge_techniques,
    parse_pass_tokens,
    reuse_of,
    row_techniques,
)

A = {"reusable": 400, "removed": 0, "added": 10}
B = {"reusable": 0, "removed": 200, "added": 0}


def row(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "gpt-4o", "prompt_tokens": 1000, "cached_tokens": 600,
                            "cf_cached_tokens": 100, "input_usd": 0.002, "cf_input_usd": 0.004,
                            "pass_tokens": json.dumps({"a": A, "b": B})}
    base.update(kw)
    return base


# by hand: cf_prompt = 1000 + 200 - 10 = 1190; cf rate = 0.004 / 1190 per token
USD_A = 400 * 1.25e-6 - 10 * 2.5e-6  # reusable x (input - cached) - added x input = 0.000475
USD_B = 200 * 0.004 / 1190  # removed x cf rate
USD_REST = 0.002 - USD_A - USD_B  # the whole saving (cf - input) minus the parts


def test_parse_pass_tokens_keeps_only_readable_entries() -> None:
    assert parse_pass_tokens(None) == {} and parse_pass_tokens("") == {}
    assert parse_pass_tokens("not json") == {} and parse_pass_tokens("[1, 2]") == {}
    text = json.dumps({"a": {"reusable": "3", "removed": None}, "b": 5, "c": {"added": "x"},
                       "d": {"added": 2, "other": 9}})
    assert parse_pass_tokens(text) == {"a": {"reusable": 3, "removed": 0, "added": 0},
                                       "d": {"reusable": 0, "removed": 0, "added": 2}}


def test_reuse_counts_only_rows_with_usage_and_a_counterfactual() -> None:
    assert reuse_of(row()) == 500
    assert reuse_of(row(prompt_tokens=None)) == 0
    assert reuse_of(row(cf_cached_tokens=None)) == 0
    assert reuse_of(row(cached_tokens=None)) == -100  # no cached tokens: 0 - cf_cached
    assert reuse_of(row(cached_tokens=50)) == -50  # a rewrite that broke a prefix is charged


def test_usd_per_technique_by_hand() -> None:
    got = attribute_usd(parse_pass_tokens(row()["pass_tokens"]), row())
    assert got is not None and set(got) == {"a", "b", UNATTRIBUTED}
    assert got["a"] == pytest.approx(USD_A, rel=1e-12, abs=0)
    assert got["b"] == pytest.approx(USD_B, rel=1e-12, abs=0)
    assert got[UNATTRIBUTED] == pytest.approx(USD_REST, rel=1e-9, abs=0)
    assert sum(got.values()) == pytest.approx(0.002, rel=1e-12, abs=0)


@pytest.mark.parametrize("missing", ["prompt_tokens", "input_usd", "cf_input_usd"])
def test_a_row_not_priced_both_ways_gets_no_usd(missing: str) -> None:
    assert attribute_usd({"a": A}, row(**{missing: None})) is None


def test_an_unknown_model_puts_the_whole_saving_in_the_remainder() -> None:
    assert attribute_usd({"a": A, "b": B}, row(model="no-such-model")) == {
        UNATTRIBUTED: pytest.approx(0.002, rel=1e-12, abs=0)}
    assert attribute_usd({"a": A}, row(model=None)) == {UNATTRIBUTED: pytest.approx(0.002)}


def test_a_zero_remainder_and_zero_parts_are_left_out() -> None:
    zero = {"z": {"reusable": 0, "removed": 0, "added": 0}}
    assert attribute_usd(zero, row(input_usd=0.004)) == {}
    # exactly the pass's own value: no remainder entry
    only_a = attribute_usd({"a": A}, row(input_usd=0.004 - USD_A))
    assert only_a is not None and set(only_a) == {"a"}


def test_no_counterfactual_prompt_left_prices_removed_tokens_at_zero() -> None:
    """cf_prompt = prompt + removed - added <= 0: the cf rate is 0, not a division error."""
    passes = {"p": {"reusable": 0, "removed": 5, "added": 15}}
    got = attribute_usd(passes, row(prompt_tokens=10, input_usd=0.001, cf_input_usd=0.001))
    assert got is not None
    assert got["p"] == pytest.approx(-15 * 2.5e-6, rel=1e-12, abs=0)  # only the added tokens
    assert got[UNATTRIBUTED] == pytest.approx(15 * 2.5e-6, rel=1e-12, abs=0)


def test_row_techniques_by_hand() -> None:
    got = row_techniques(row())
    assert {n: (t["reusable"], t["removed"], t["added"]) for n, t in got.items()} == {
        "a": (400, 0, 10), "b": (0, 200, 0), UNATTRIBUTED: (100, 0, 0)}  # 500 reused - 400 credited
    assert got["a"]["usd"] == pytest.approx(USD_A, rel=1e-12, abs=0)
    assert got[UNATTRIBUTED]["usd"] == pytest.approx(USD_REST, rel=1e-9, abs=0)
    # reuse fully credited: no token remainder, but the USD remainder still gets an entry
    exact = row_techniques(row(cached_tokens=500))
    assert exact[UNATTRIBUTED] == {"reusable": 0, "removed": 0, "added": 0,
                                   "usd": pytest.approx(USD_REST, rel=1e-9, abs=0)}
    unpriced = row_techniques(row(input_usd=None, cached_tokens=500))
    assert set(unpriced) == {"a", "b"} and unpriced["a"]["usd"] is None


def test_figures_of_one_technique() -> None:
    t = TechniqueFigures("x", tokens_reusable=7, tokens_removed=5, tokens_added=3)
    assert t.saved_tokens == 9 and t.usd is None
    t.add_usd(0.25)
    t.add_usd(0.5)
    assert t.usd == 0.75
    t.add_usd(0.123456789 - 0.75)
    assert t.to_dict() == {"technique": "x", "tokens_reusable": 7, "tokens_removed": 5,
                           "tokens_added": 3, "saved_tokens": 9, "usd": 0.12345679}
    assert TechniqueFigures("y").to_dict()["usd"] is None


def test_merge_sums_and_sorts_by_usd_then_tokens_remainder_last() -> None:
    parts = [
        {"a": {"reusable": 10, "removed": 0, "added": 0, "usd": 0.5},
         UNATTRIBUTED: {"reusable": 1000, "removed": 0, "added": 0, "usd": 9.0},
         "c": {"reusable": 1, "usd": None}},
        {"a": {"reusable": 5, "removed": 2, "added": 1, "usd": 0.25},
         "b": {"reusable": 0, "removed": 30, "added": 0, "usd": 0.75},
         "c": {"reusable": 2, "removed": None, "added": None, "usd": 0.0},
         "d": {"reusable": 50}, "e": {"reusable": 50}},
    ]
    got = merge_techniques(parts)
    assert [t.technique for t in got] == ["b", "a", "d", "e", "c", UNATTRIBUTED]
    by = {t.technique: t for t in got}
    assert (by["a"].tokens_reusable, by["a"].tokens_removed, by["a"].tokens_added) == (15, 2, 1)
    assert by["a"].usd == 0.75 and by["b"].usd == 0.75  # equal usd: more saved tokens first
    assert by["c"].usd == 0.0 and by["c"].tokens_reusable == 3  # a priced 0 is not None
    assert by["d"].usd is None


def test_by_technique_and_added_tokens_over_rows() -> None:
    rows = [row(), row(pass_tokens=json.dumps({"a": A}), cf_cached_tokens=None)]
    got = {t.technique: t for t in by_technique(rows)}
    assert got["a"].tokens_reusable == 800 and got["a"].tokens_added == 20
    assert got[UNATTRIBUTED].tokens_reusable == 100 - 400  # the second row reused nothing measured
    assert added_tokens(rows) == 20 and added_tokens([]) == 0
    assert added_tokens([{"pass_tokens": None, "prompt_tokens": 9},
                         {"pass_tokens": json.dumps({"x": {"added": 3}}), "prompt_tokens": 9}]) == 3
    assert added_tokens([{"pass_tokens": json.dumps({"x": {"added": 3}})}]) == 0  # no usage


@given(st.dictionaries(st.sampled_from("pqrs"), st.fixed_dictionaries(
    {"reusable": st.integers(0, 5000), "removed": st.integers(0, 5000), "added": st.integers(0, 200)}),
    max_size=4), st.integers(0, 5000), st.integers(0, 5000))
def test_parts_add_up_to_the_whole(passes: dict[str, dict[str, int]], cached: int, cf_cached: int) -> None:
    """Per row, tokens: sum of (reusable + removed - added) = (cached - cf_cached) + removed -
    added; USD: sum = cf_input_usd - input_usd."""
    r = row(pass_tokens=json.dumps(passes), cached_tokens=cached, cf_cached_tokens=cf_cached)
    got = row_techniques(r)
    removed = sum(f["removed"] for f in passes.values())
    added = sum(f["added"] for f in passes.values())
    assert sum(t["reusable"] + t["removed"] - t["added"] for t in got.values()) == (
        cached - cf_cached + removed - added)
    assert sum(t["usd"] or 0.0 for t in got.values()) == pytest.approx(0.002, rel=1e-9, abs=1e-15)


def test_a_pass_naming_only_some_fields_counts_the_others_as_zero() -> None:
    """attribute_usd takes partial figures: a missing field is 0, in the pass's value and in
    the counterfactual prompt (cf_prompt = 1000 + 200 - 10 = 1190 as in USD_B)."""
    passes = {"r": {"reusable": 400}, "m": {"removed": 200}, "n": {"added": 10}}
    got = attribute_usd(passes, row())
    assert got is not None
    assert got["r"] == pytest.approx(400 * 1.25e-6, rel=1e-12, abs=0)
    assert got["m"] == pytest.approx(USD_B, rel=1e-12, abs=0)
    assert got["n"] == pytest.approx(-10 * 2.5e-6, rel=1e-12, abs=0)


def test_a_counterfactual_prompt_of_one_token_has_its_rate() -> None:
    passes = {"p": {"reusable": 0, "removed": 1, "added": 0}}  # cf_prompt = 0 + 1 - 0 = 1
    got = attribute_usd(passes, row(prompt_tokens=0, input_usd=0.0, cf_input_usd=0.001))
    assert got == {"p": pytest.approx(0.001, rel=1e-12, abs=0)}


def test_a_remainder_of_one_pico_dollar_is_dropped() -> None:
    """|rest| must exceed 1e-12 USD to be named: exactly 1e-12 is rounding noise."""
    assert attribute_usd({}, row(model="no-such-model", input_usd=0.0, cf_input_usd=1e-12)) == {}
    assert attribute_usd({}, row(model="no-such-model", input_usd=0.0, cf_input_usd=2e-12)) == {
        UNATTRIBUTED: 2e-12}
