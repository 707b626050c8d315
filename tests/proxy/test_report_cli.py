"""``prefixgate report`` (issue 9, item 6): fits the terminal (80 and 120 columns), opens with a
"saved" line, groups by route / model / tenant / day, lists errors, and its JSON / CSV numbers
equal the ledger's."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.proxy.cli import app

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def _ledger(tmp_path: Path) -> str:
    led = Ledger(tmp_path / "ledger.sqlite")
    for i in range(12):
        ho = i % 4 == 3
        led.write(LedgerRow(
            ts=T0 + i * 7200, route="claude-sonnet-*" if i % 2 else "gpt-*",
            backend="anthropic-main" if i % 2 else "openai-main",
            model="claude-sonnet-4-5-20250929" if i % 2 else "gpt-4o-2024-08-06",
            key_id="k_team_a" if i < 6 else "", prompt_tokens=12_345 + i, cached_tokens=8_000,
            cache_write_tokens=500 if i % 2 else None, output_tokens=321,
            cf_cached_tokens=8_000 if ho else 1_000, tokens_pruned=0 if ho else 250,
            input_usd=0.0191 + i / 1e4, cf_input_usd=(0.0191 + i / 1e4) if ho else 0.0345,
            ttft_ms=850.0 + 10 * i, tpot_ms=24.5, ttft_source="reported" if i % 3 else "measured",
            holdout=ho, edits="off" if ho else "hoist_volatile", stream=not i % 3,
            cf_source="holdout" if ho else ("measured" if i == 0 else "modelled"),
            pass_tokens="" if ho else '{"hoist_volatile":{"reusable":7000,"removed":0,'
                                      '"added":30},"prune_rag":{"reusable":0,"removed":250,'
                                      '"added":0}}'))
    led.write(LedgerRow(ts=T0 + 50, route="gpt-*", backend="openai-main", model="gpt-4o",
                        status="upstream_error", http_status=502, error="upstream 502"))
    led.close()
    return str(tmp_path / "ledger.sqlite")


def _run(args: list[str], columns: int = 80) -> str:
    res = CliRunner().invoke(app, ["report", *args], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("columns", [80, 120, 160])
@pytest.mark.parametrize("by", ["route", "model", "tenant", "day"])
def test_every_line_fits_the_terminal(tmp_path: Path, columns: int, by: str) -> None:
    out = _run(["--ledger", _ledger(tmp_path), "--by", by, "--errors"], columns)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns, "\n" + out
    assert lines[0].startswith("saved $")
    assert "…" not in out                                   # nothing cut to an ellipsis
    assert ("prompt tok" in out and "TTFT95" in out) == (columns >= 110)
    assert ("cf cached" in out and "pruned" in out) == (columns >= 140)
    assert "TTFT50" in out and "saved $" in out


def test_saved_line_and_json_equal_the_ledger(tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    rows = Ledger(path).rows()
    priced = [r for r in rows if r["input_usd"] is not None]
    saved = sum(r["cf_input_usd"] - r["input_usd"] for r in priced)
    cf = sum(r["cf_input_usd"] for r in priced)
    added = sum(30 for r in rows if r["pass_tokens"])            # the hoisted notes
    tokens = sum(r["cached_tokens"] - r["cf_cached_tokens"] for r in priced) + sum(
        r["tokens_pruned"] for r in rows) - added
    out = _run(["--ledger", path])
    assert out.splitlines()[0].startswith(
        f"saved ${saved:,.4f} ({100 * saved / cf:.1f}% of ${cf:,.4f}) · {tokens:,} tokens")
    doc = json.loads(_run(["--ledger", path, "--json", "--by", "model", "--errors"]))
    assert doc["saved"]["saved_usd"] == pytest.approx(saved)
    assert doc["saved"]["n_holdout"] == 3 and doc["saved"]["ttft_p50_diff_ms"] is not None
    groups = {g["model"]: g for g in doc["groups"]}
    g = groups["claude-sonnet-4-5-20250929"]
    mine = [r for r in rows if r["model"] == g["model"]]
    assert g["requests"] == len(mine) and g["prompt_tokens"] == sum(r["prompt_tokens"]
                                                                    for r in mine)
    assert g["ttft_reported"] == sum(r["ttft_source"] == "reported" for r in mine)
    tech = {t["technique"]: t for t in doc["by_technique"]}
    assert tech["prune_rag"]["tokens_removed"] == 250 * 9 and tech["hoist_volatile"][
        "tokens_added"] == 30 * 9
    assert sum(t["usd"] for t in tech.values()) == pytest.approx(saved)  # all of it, split
    # the parts add up: the per-technique tokens, the named remainder included, are the total
    assert sum(t["saved_tokens"] for t in tech.values()) == tokens == doc["saved"]["saved_tokens"]
    assert tech["unattributed"]["tokens_reusable"] == tokens + added - 250 * 9 - 7000 * 9
    assert doc["errors"] == [{"status": "upstream_error", "http_status": 502,
                              "error": "upstream 502", "count": 1, "last_ts": T0 + 50,
                              "routes": ["gpt-*"]}]


def test_saved_line_says_how_each_counterfactual_was_obtained(tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    rows = Ledger(path).rows()
    want = {k: sum(r["cf_source"] == k for r in rows) for k in ("measured", "modelled", "holdout")}
    want["none"] = sum(r["cf_source"] == "" for r in rows)
    doc = json.loads(_run(["--ledger", path, "--json"]))
    assert doc["saved"]["cf_source"] == want
    head = " ".join(_run(["--ledger", path]).split("route ")[0].split())
    assert (f"counterfactual: {want['measured']} measured, {want['modelled']} modelled, "
            f"{want['holdout']} holdout, {want['none']} none") in head


def test_by_tenant_groups_by_the_ledger_tenant_before_the_key(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "t.sqlite")
    for tenant, key in (("acme", "k1"), ("acme/team-a", "k1"), ("", "k2"), ("", "")):
        led.write(LedgerRow(ts=T0, route="r", model="m", tenant=tenant, key_id=key,
                            prompt_tokens=10, cached_tokens=0))
    led.close()
    doc = json.loads(_run(["--ledger", str(tmp_path / "t.sqlite"), "--json", "--by", "tenant"]))
    assert sorted((g["tenant"], g["requests"]) for g in doc["groups"]) == [
        ("-", 1), ("acme", 1), ("acme/team-a", 1), ("k2", 1)]


def test_csv_and_tenant_and_day_groups(tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    table = list(csv.DictReader(io.StringIO(_run(["--ledger", path, "--csv", "--by",
                                                  "tenant"]))))
    assert [t["tenant"] for t in table] == ["-", "k_team_a"]
    assert [int(t["requests"]) for t in table] == [7, 6]
    days: dict[str, Any] = {g["day"]: g for g in json.loads(
        _run(["--ledger", path, "--json", "--by", "day"]))["groups"]}
    assert sorted(days) == ["2027-01-15", "2027-01-16"]
    assert sum(g["requests"] for g in days.values()) == 13


def test_unknown_grouping_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", "--ledger", _ledger(tmp_path), "--by", "colour"])
    assert res.exit_code == 2 and "--by must be one of" in res.output


FORMULAS = ["=cmd|' /C calc'!A0", "+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "\n=1+1"]


def _csv_ledger(tmp_path: Path, models: list[str]) -> str:
    led = Ledger(tmp_path / "csv.sqlite")
    for m in models:
        led.write(LedgerRow(ts=T0, route="*", backend="b", model=m, prompt_tokens=100,
                            input_usd=0.0200, cf_input_usd=0.0150))  # rewriting cost more
    led.close()
    return str(tmp_path / "csv.sqlite")


@pytest.mark.parametrize("model", FORMULAS, ids=["eq", "plus", "minus", "at", "tab", "cr", "lf"])
def test_csv_cells_never_start_a_formula(tmp_path: Path, model: str) -> None:
    """Issue 20, class 13 (OWASP "CSV Injection"): a text cell starting with = + - @ tab CR LF
    gets a leading single quote (LF is not in the issue; OWASP lists it); the proxy's own
    negative figure stays a number."""
    out = _run(["--ledger", _csv_ledger(tmp_path, [model]), "--csv", "--by", "model"])
    rows = list(csv.reader(io.StringIO(out)))
    header, cells = rows[0], rows[1]
    assert len(rows) == 2
    assert cells[0] == "'" + model
    saved = cells[header.index("saved_usd")]
    assert float(saved) == pytest.approx(-0.005) and saved.startswith("-")  # stays a number
    # read as a spreadsheet would (unquoted cells are numbers): still a float, not text
    typed = list(csv.reader(io.StringIO(out), quoting=csv.QUOTE_NONNUMERIC))[1]
    assert typed[header.index("saved_usd")] == pytest.approx(-0.005)
    assert typed[header.index("requests")] == 1.0


def test_csv_separators_and_quotes_cannot_open_a_new_formula_cell(tmp_path: Path) -> None:
    """Not in the issue: a ``;`` (the list separator of many locales) or a quote inside a
    name must not start a new cell with a trigger: every text cell is quoted, quotes doubled;
    harmless names and the report's own ``-`` key are unchanged."""
    names = ['x;=1+1', 'y",=1+1', "gpt-4o", "-5", "- "]
    out = _run(["--ledger", _csv_ledger(tmp_path, names), "--csv", "--by", "model"])
    raw = out.splitlines()
    assert '"x;=1+1"' in out and '"y"",=1+1"' in out
    cells = {r[0] for r in csv.reader(io.StringIO(out))}
    assert {"x;=1+1", 'y",=1+1', "gpt-4o", "'-5", "'- "} <= cells
    assert all(not line.startswith(tuple("=+@\t\r")) for line in raw)
    (tmp_path / "n").mkdir()
    path = _csv_ledger(tmp_path / "n", [])
    led = Ledger(path)
    led.write(LedgerRow(ts=T0, route="r", model="m", prompt_tokens=1))
    led.close()
    rows = list(csv.reader(io.StringIO(_run(["--ledger", path, "--csv", "--by", "tenant"]))))
    assert rows[1][0] == "-"  # no tenant: the report's own key, not a formula
