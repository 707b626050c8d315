"""``prefixgate report`` / ``replay`` against a proxy in front of a scripted upstream, and the
break + counterfactual records the proxy writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from prefixgate.proxy.cli import app
from tests.paths import DATA
from tests.proxy.upstream import DONE, Script, chunk, wait_rows

RULES = "Follow the airline policy. Be brief. Verify the user id first. " * 40


def clock_turns() -> list[dict[str, Any]]:
    sys1 = f"You are Helper. Now: 2025-03-04 10:15. {RULES}"
    return [{"model": "m", "messages": [{"role": "system", "content": sys1},
                                        {"role": "user", "content": "Q1"}]},
            {"model": "m", "messages": [{"role": "system", "content": sys1.replace("10:15",
                                                                                   "10:16")},
                                        {"role": "user", "content": "Q1"},
                                        {"role": "assistant", "content": "A1"},
                                        {"role": "user", "content": "Q2"}]}]


def test_volatile_break_and_counterfactual_recorded_and_reported(rig: Any) -> None:
    from tests.proxy.upstream import completion

    rig.upstream.script = Script(body=completion())
    for body in clock_turns():
        httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30,
                   headers={"x-prefixgate-session": "s", "x-prefixgate-rewrite": "off"})
    breaks = rig.ledger.breaks()
    assert len(breaks) == 1 and breaks[0]["kind"] == "volatile_span"
    assert breaks[0]["region"] == "system" and breaks[0]["excerpt_before"] is None
    rows = rig.ledger.rows()
    # sent as-is: the counterfactual is what the upstream itself reported
    assert [r["cf_cached_tokens"] for r in rows] == [r["cached_tokens"] for r in rows]

    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path, "--breaks"])
    assert res.exit_code == 0, res.output
    assert "m*" in res.output and "volatile_span" in res.output
    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path, "--json"])
    figures = json.loads(res.output)["groups"][0]
    assert figures["route"] == "m*" and figures["requests"] == 2
    assert figures["cached_share"] == 8 / 20


def test_counterfactual_of_a_rewritten_request_comes_from_the_cache_model(
        rig_factory: Any) -> None:
    from prefixgate.rewriter.pipeline import rewrite_request
    from tests.proxy.upstream import completion

    rig = rig_factory(rewrite_fn=rewrite_request, rewrite={"hoist_volatile": True})  # opt-in move
    rig.upstream.script = Script(body=completion())
    for body in clock_turns():
        httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30,
                   headers={"x-prefixgate-session": "s2"})
    rows = rig.ledger.rows()
    # the clock moves once seen changing (issue 19, item 2): turn 1 goes out as sent, turn 2
    # is rewritten, and its counterfactual is modelled
    assert rows[0]["edits"] == "none" and rows[1]["edits"] not in ("none", "off")
    # the client's own bodies differ at the clock near the top: almost nothing would be cached
    assert rows[1]["cf_cached_tokens"] is not None and rows[1]["cf_cached_tokens"] < 50


def test_report_without_a_ledger_says_so(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", "--ledger", str(tmp_path / "none.sqlite")])
    assert res.exit_code == 1 and "no ledger" in res.output


def test_replay_sends_each_side_with_its_own_session_and_counts_skips(rig: Any,
                                                                      tmp_path: Path) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 60}}

    def script(body: dict[str, Any]) -> Script:
        if len(body["messages"]) > 6:  # pretend later requests exceed the context
            return Script(status=400, body={"error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                           "messages resulted in 9000 tokens.", "type": "invalid_request_error",
                "param": "messages", "code": "context_length_exceeded"}})
        return Script(pieces=[chunk("a"), chunk("b"), chunk(finish="stop"), chunk(usage=usage),
                              DONE])

    rig.upstream.script = script
    out = tmp_path / "replay.json"
    trace = DATA / "traces" / "tau_bench_airline_gpt4o.json"
    res = CliRunner().invoke(app, ["replay", str(trace), "--proxy", rig.url, "--runs", "1",
                                   "--max-requests", "5", "--volatile-clock", "--model", "m",
                                   "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("prefixgate ")
    for side in ("off", "on"):
        f = doc["figures"][side]
        assert f["requests"] + f["skipped"] == 5 and f["skipped"] >= 1
        assert f["cached_share"] == 0.6 and f["ttft_p50_ms"] is not None
    seen = rig.upstream.seen
    assert len(seen) == 10
    salts = [s.json["cache_salt"] for s in seen]
    assert len(set(salts[:5])) == 1 and len(set(salts[5:])) == 1 and salts[0] != salts[5]
    assert all(s.json["stream"] is True and s.json["max_tokens"] == 8 for s in seen)
    first_system = seen[0].json["messages"][0]["content"]
    assert "2024-05-15 15:00:00" not in first_system  # wall clock put in
    rows = wait_rows(rig.ledger, 10)
    assert [r["rewrite"] for r in rows] == [0] * 5 + [1] * 5
    assert len({r["session"] for r in rows[:5]}) == 1 and rows[0]["session"] != rows[5]["session"]


def test_replay_exits_nonzero_when_nothing_got_through(rig: Any) -> None:
    trace = DATA / "traces" / "tau_bench_airline_gpt4o.json"
    res = CliRunner().invoke(app, ["replay", str(trace), "--proxy", rig.url, "--max-requests",
                                   "1", "--model", "no-route-for-this"])
    assert res.exit_code == 1 and "model_not_found" in res.output


def test_prompt_cost_priced_from_usage_and_counterfactual(rig: Any) -> None:
    from tests.proxy.upstream import completion

    usage = {"prompt_tokens": 1000, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 800}}
    rig.upstream.script = Script(body=completion(usage=usage))
    httpx.post(rig.url + "/v1/chat/completions", timeout=30, json={
        "model": "gpt-4o", "messages": [{"role": "user", "content": "x " * 900}]})
    row = rig.ledger.rows()[-1]
    # gpt-4o: $2.50 / 1M input, $1.25 / 1M cached input (prefixgate/config/prices.py)
    assert abs(row["input_usd"] - (200 * 2.50 + 800 * 1.25) / 1e6) < 1e-12
    assert row["cf_input_usd"] is not None and row["cf_input_usd"] > 0  # first request: cold
    res = CliRunner().invoke(app, ["report", "--ledger", rig.ledger.path, "--json"])
    s = json.loads(res.output)["groups"][0]
    assert s["route"] == "gpt-*"
    assert abs(s["input_usd"] - row["input_usd"]) < 1e-12
