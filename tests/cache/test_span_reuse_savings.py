"""Issue 33: the engine's span reuse in the savings arithmetic — a measured technique whose
tokens come out of the counterfactual (a prefix cache), never kept a pass on, and a break it
bridged is no loss."""

from __future__ import annotations

from dataclasses import asdict

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.attribution import (
    SPAN_REUSE,
    UNATTRIBUTED,
    by_technique,
    reuse_of,
    row_techniques,
)
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.breaks import BreakRecord, break_advice, format_breaks
from prefixgate.cache.savings.counterfactual import measured_counterfactual
from prefixgate.cache.savings.stand_back import saved_tokens
from prefixgate.cache.savings.top_break import BRIDGED_NOTE, explain_breaks, top_break


def test_a_row_sent_as_is_has_the_prefix_cache_as_its_counterfactual() -> None:
    row = LedgerRow(edits="none", prompt_tokens=1000, cached_tokens=900, span_reused_tokens=700)
    measured_counterfactual(row)
    assert (row.cf_cached_tokens, row.cf_source) == (200, "measured")


def test_span_reuse_is_its_own_technique_and_the_parts_still_add_up() -> None:
    # rewritten row, modelled counterfactual 150 (the client's body on a prefix cache); a pass
    # credited 40; the engine reused 700 across a changed span
    row = asdict(LedgerRow(edits="canonicalize_tools", prompt_tokens=1000, cached_tokens=900,
                           cf_cached_tokens=150, span_reused_tokens=700,
                           pass_tokens='{"canonicalize_tools":{"reusable":40,"removed":0,'
                                       '"added":0}}'))
    tech = row_techniques(row)
    assert tech[SPAN_REUSE]["reusable"] == 700
    assert tech[UNATTRIBUTED]["reusable"] == 900 - 150 - 40 - 700
    assert sum(t["reusable"] for t in tech.values()) == reuse_of(row)


def test_span_reuse_counts_only_where_the_rest_of_the_saving_does() -> None:
    no_cf = asdict(LedgerRow(prompt_tokens=1000, cached_tokens=900, span_reused_tokens=700))
    no_usage = asdict(LedgerRow(span_reused_tokens=700, cf_cached_tokens=0))
    assert row_techniques(no_cf) == {} and row_techniques(no_usage) == {}


def test_by_technique_and_the_rollups_name_the_engine_technique() -> None:
    rows = [asdict(LedgerRow(ts=60.0 * i, edits="none", prompt_tokens=1000, cached_tokens=900,
                             cf_cached_tokens=200, span_reused_tokens=700)) for i in range(3)]
    figs = {t.technique: t.saved_tokens for t in by_technique(rows)}
    assert figs == {SPAN_REUSE: 2100}
    data = rollup.total({"data": rollup.fold(r)} for r in rows)
    assert data["span_reused_tokens"] == 2100 and data["tech"][SPAN_REUSE]["reusable"] == 2100


def test_the_ledger_keeps_the_column() -> None:
    led = Ledger(":memory:")
    led.write(LedgerRow(prompt_tokens=10, cached_tokens=8, span_reused_tokens=5))
    assert led.rows()[0]["span_reused_tokens"] == 5


def test_the_engine_span_reuse_never_keeps_a_pass_on() -> None:
    # the passes added 30 tokens and made nothing reusable; the engine reused 700
    row = asdict(LedgerRow(prompt_tokens=1000, cached_tokens=900, cf_cached_tokens=200,
                           span_reused_tokens=700,
                           pass_tokens='{"hoist_volatile":{"reusable":0,"removed":0,"added":30}}'))
    assert saved_tokens(row) == -30


def _brk(bridged: int, lost: int = 300) -> BreakRecord:
    return BreakRecord("s", 1, "volatile_span", "system", 0, 0, 0, 14, lost,
                       "system[0] differs only in datetime", ("datetime",),
                       bridged_tokens=bridged)


def test_a_bridged_break_keeps_its_cause_and_loses_nothing() -> None:
    text = " ".join(format_breaks([_brk(700)]).split())
    assert "volatile_span" in text and "differs only in datetime" in text
    assert "bridged by the engine (700 tokens reused across the changed span)" in text
    assert "0 prefix tokens lost" in text
    assert break_advice([_brk(700)]) == ""


def test_only_the_unbridged_breaks_ask_for_a_move() -> None:
    advice = break_advice([_brk(700), _brk(0, lost=120)])
    assert advice.startswith("120 of those tokens") and "hoist_volatile" in advice


def test_the_dashboard_top_break_is_never_a_bridged_one() -> None:
    bridged = {**_brk(700).to_dict(), "excerpt": "Current time: NN:NN"}
    lost = {**_brk(0, lost=120).to_dict(), "excerpt": "request id: NNNN"}
    rows = [{"prompt_tokens": 1000}]
    explained = explain_breaks([bridged, lost], rows)
    by_excerpt = {e["excerpt"]: e for e in explained}
    assert by_excerpt["Current time: NN:NN"]["tokens_lost"] == 0
    assert by_excerpt["Current time: NN:NN"]["bridged_tokens"] == 700
    assert by_excerpt["Current time: NN:NN"]["fix_note"] == BRIDGED_NOTE
    assert by_excerpt["request id: NNNN"]["tokens_lost"] == 120
    top = top_break(explained, rows)
    assert top is not None and top["excerpt"] == "request id: NNNN"
    assert top_break(explain_breaks([bridged], rows), rows) is None
