"""Meaning-guard trial sends are in the ledger but never in the savings (issue 36).

A trial row (``trial`` = the move judged) must move no savings figure: the ``/api/savings``
document (rollups, rows, holdout, routes, replicas, top break) and ``prefixgate report``'s JSON
are the same with and without trial rows; their cost is summed on its own line
(:mod:`prefixgate.cache.savings.trial_cost`). Each exclusion point fails this test when it is
removed: the rollup fold (:func:`prefixgate.cache.ledger.rollup.counted`), the rows read by the
document (:func:`prefixgate.cache.savings.summary.range_rows`) and :meth:`Ledger.rows` (the
report's).
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixgate.cache.ledger.pg_schema import MIGRATIONS
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.summary import savings_document
from prefixgate.cache.savings.trial_cost import trial_line, trial_rows, trial_spend
from prefixgate.proxy.cli import app

T0 = 1_800_000_000.0


def _client_rows(led: Ledger) -> None:
    for i in range(6):
        led.write(LedgerRow(
            ts=T0 + i * 60, route="gpt-*", backend="openai-main", model="gpt-4o",
            prompt_tokens=4000 + i, cached_tokens=2048, output_tokens=50, cf_cached_tokens=1024,
            input_usd=0.006, cf_input_usd=0.008, ttft_ms=300.0 + i, tpot_ms=20.0,
            edits="hoist_volatile", cf_source="modelled", session=f"s{i % 2}",
            pass_tokens='{"hoist_volatile":{"reusable":1024,"removed":0,"added":12}}'))


def _trial_rows(led: Ledger) -> None:
    for i in range(3):  # one trial: original, original again, variant
        led.write(LedgerRow(
            ts=T0 + 100 + i, route="gpt-*", backend="openai-main", model="gpt-4o",
            prompt_tokens=3000, cached_tokens=0, output_tokens=16, cf_cached_tokens=3000,
            input_usd=0.0075, cf_input_usd=0.5, ttft_ms=5.0, total_ms=9.0, rewrite=True,
            trial="hoist_volatile", session="s0", replica="elsewhere",
            pass_tokens='{"hoist_volatile":{"reusable":9999,"removed":0,"added":12}}'))


def _figures(path: Path) -> tuple[dict, dict]:
    led = Ledger(path)
    doc = savings_document(led, "24h", now=T0 + 600)
    led.close()
    out = CliRunner().invoke(app, ["report", "--ledger", str(path), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    report.pop("ledger")
    report.pop("trials")  # the trials' own cost line (test_trial_cost_is_summed_on_its_own)
    return {k: v for k, v in doc.items() if k not in ("from_ts", "to_ts")}, report


def test_trial_rows_move_no_savings_figure(tmp_path: Path) -> None:
    plain, mixed = tmp_path / "plain.sqlite", tmp_path / "mixed.sqlite"
    for p, with_trials in ((plain, False), (mixed, True)):
        led = Ledger(p)
        _client_rows(led)
        if with_trials:
            _trial_rows(led)
        led.close()
    doc_a, rep_a = _figures(plain)
    doc_b, rep_b = _figures(mixed)
    assert doc_a["totals"]["requests"] == 6
    assert doc_a == doc_b
    assert rep_a == rep_b


def test_trial_cost_is_summed_on_its_own(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    _client_rows(led)
    _trial_rows(led)
    rows = trial_rows(led)
    assert [r["trial"] for r in rows] == ["hoist_volatile"] * 3
    assert len(led.rows()) == 6 and len(led.rows(trials=True)) == 9
    spend = trial_spend(rows)
    # gpt-4o: $10 / M output tokens: 3 x (0.0075 + 16 x 10 / 1e6) = 0.02298
    assert spend["requests"] == 3 and spend["tokens"] == 3 * 3016
    assert abs(spend["usd"] - 0.02298) < 1e-9
    assert trial_line(spend) == "meaning-guard trials: 3 requests, 9048 tokens, $0.0230"
    led.close()


def test_the_trial_column_has_a_postgresql_migration() -> None:
    assert any("ADD COLUMN IF NOT EXISTS trial TEXT" in sql for _, sql in MIGRATIONS)
