"""Plain ``prefixgate report`` names the top cache break (issue 37, item 1): its cause, the
masked line, where in the backend's tokens, what it cost and the policy line that fixes it —
the same object as ``/api/savings``' ``top_break`` (one source)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings.summary import savings_document
from prefixgate.proxy.cli import app


def _ledger(tmp_path: Path, lost: int = 2_300) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite")
    for i in range(8):  # one 8-turn session on a local engine: ~2.3k tokens, 37 cached a turn
        led.write(LedgerRow(route="SmolLM2-135M-Instruct", backend="local",
                            model="SmolLM2-135M-Instruct", session="auto-1",
                            prompt_tokens=2_300 + 40 * i, cached_tokens=37 if i else 0,
                            prefill_ms=(2_300 + 40 * i - (37 if i else 0)) * 2.0, ttft_ms=5000.0))
        if i:
            led.write_break("auto-1", {
                "session_id": "auto-1", "request_seq": i, "kind": "volatile_span",
                "region": "system", "block_index": 0, "sub_index": 0, "flat_index": 0,
                "token_offset": 37, "tokens_lost": lost + 40 * (i - 1), "detail": "system[0] differs",
                "volatile_kinds": ["datetime"], "excerpt": "Current time: \u27e8datetime\u27e9",
                "line": 2, "unit": "engine", "route": "SmolLM2-135M-Instruct", "backend": "local",
                "model": "SmolLM2-135M-Instruct"})
    return led


def _report(led: Ledger, *args: str) -> str:
    res = CliRunner().invoke(app, ["report", "--ledger", led.path, *args],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    return res.output


def test_plain_report_opens_with_the_breaks_cause_excerpt_cost_and_fix(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    out = _report(led)
    first = out.splitlines()[:24]  # the first screen
    text = " ".join(" ".join(first).split())
    assert "top cache break: a clock in the system prompt changes on every request" in text
    assert "(7 times, 1 session)" in text
    assert "\"Current time: \u27e8datetime\u27e9\" · system prompt, line 2" in text
    assert "breaks at token 37: SmolLM2-135M-Instruct's own tokens" in text
    assert "cost: 16,940 prompt tokens prefilled again" in text
    assert "33.9 s of prefill" in text  # 2 ms a token, the engine's measured rate
    assert "fix: rewrite: {hoist_volatile: true}" in text
    assert all(len(line) <= 80 for line in out.splitlines())
    doc = json.loads(_report(led, "--json"))
    api = savings_document(led, "7d")
    assert doc["top_break"] == api["top_break"] and api["top_break"] == api["breaks"][0]
    assert (doc["top_break"]["tokens_lost"], doc["top_break"]["seconds_lost"]) == (16_940, 33.88)


def test_a_break_below_the_threshold_stays_off_the_first_screen(tmp_path: Path) -> None:
    led = _ledger(tmp_path, lost=10)
    assert "top cache break" not in _report(led)
    assert savings_document(led, "7d")["top_break"] is None
    assert "volatile_span" in _report(led, "--breaks")  # still listed on request


def test_requests_refused_before_routing_are_a_labelled_route_row(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "ledger.sqlite")
    led.write(LedgerRow(route="gpt-*", backend="openai", model="gpt-4o", prompt_tokens=10,
                        cached_tokens=0, ttft_ms=50.0))
    led.write(LedgerRow(model="gtp-4o", status="model_not_found", http_status=404))
    out = _report(led)
    assert "(no route matched)" in out
    assert not any(line.split()[:1] == ["-"] for line in out.splitlines())
    routes = savings_document(led, "7d")["routes"]
    assert [(r["route"], r["model"]) for r in routes] == [("(no route matched)", "gtp-4o"),
                                                          ("gpt-*", "gpt-4o")]


def test_holdout_breaks_are_left_out_and_an_active_hoist_is_not_advised_again(
        tmp_path: Path) -> None:
    from prefixgate.cache.savings.top_break import HOIST_ON_NOTE, explain_breaks

    rec = {"kind": "volatile_span", "region": "system", "excerpt": "Now: \u27e8datetime\u27e9",
           "tokens_lost": 500, "token_offset": 10, "session_id": "a"}
    assert explain_breaks([{**rec, "holdout": True}], []) == []
    (hoisted,) = explain_breaks([{**rec, "hoist_on": True}, rec], [])
    assert hoisted["fix"] == "" and hoisted["fix_note"] == HOIST_ON_NOTE
    (plain,) = explain_breaks([rec], [])
    assert plain["fix"] == "rewrite: {hoist_volatile: true}"
