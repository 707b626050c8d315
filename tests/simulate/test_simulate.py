"""``prefixgate simulate`` end to end on a few runs of the real tau-bench airline trace."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.cli import app
from prefixgate.proxy.sim.simulate import SimConfig, Simulator, client_body, positional, schedule
from prefixgate.proxy.sim.traces import load_trace, to_anthropic
from tests.paths import DATA

TRACE = DATA / "traces" / "tau_bench_airline_gpt4o.json"
SWE = DATA / "traces" / "swe_agent" / "marshmallow-1867.function_calling.traj"


HOIST = RewriteSettings(hoist_volatile=True)
"""The "prefixgate" strategy with the clock moved out of the prefix: hoisting is opt-in
(``MOVES_THE_MODEL_READS``); the figures below are about what it recovers."""


@pytest.fixture(scope="module")
def runs():  # type: ignore[no-untyped-def]
    return load_trace(TRACE, runs=3)


def _shares(runs, **cfg) -> dict[str, float]:  # type: ignore[no-untyped-def]
    fig = Simulator(SimConfig(**cfg), settings=HOIST).run(runs)
    return {k: v["cached_share"] for k, v in fig["strategies"].items()}


def test_prefixgate_beats_positional_beats_none_under_anthropic_rules(runs) -> None:  # type: ignore[no-untyped-def]
    # a minute-resolution clock in the system prompt (case B03): positional hits only within
    # a minute, none never caches (no cache_control), prefixgate moves the clock out of the prefix
    s = _shares(runs, provider="anthropic", volatile_clock=True, clock_resolution_s=60)
    assert s["prefixgate"] > s["positional"] > s["none"] == 0.0
    assert s["prefixgate"] > 0.85


def test_second_resolution_clock_defeats_positional_and_breaks_are_named(runs) -> None:  # type: ignore[no-untyped-def]
    fig = Simulator(SimConfig(provider="anthropic", volatile_clock=True,
                              strategies=("positional", "prefixgate")), settings=HOIST).run(runs[:2])
    pos, pg = fig["strategies"]["positional"], fig["strategies"]["prefixgate"]
    assert pos["cached_share"] == 0.0 and pos["write_tokens"] > 0   # pays writes, never reads
    assert pos["cost_usd"] > pos["cost_no_cache_usd"]
    requests_after_first = fig["requests"] - 2
    assert pos["breaks"] == {"volatile_span": requests_after_first}
    example = pos["break_examples"]["volatile_span"][0]
    assert example["region"] == "system" and example["volatile_kinds"] == ["datetime"]
    # one system edit per session, on its second request: the clock is moved once it is seen
    # changing (issue 19, item 2), so turn 2's prefix differs from turn 1's (it would anyway)
    assert pg["breaks"] == {"system_edit": 2} and pg["rewrite_errors"] == 0
    assert pg["cost_usd"] < pg["cost_no_cache_usd"]


def test_openai_rules_prefixgate_recovers_the_prefix(runs) -> None:  # type: ignore[no-untyped-def]
    s = _shares(runs[:2], provider="openai", volatile_clock=True)
    # the system prompt is rendered before the tools (OpenAI's harmony format), so a clock in
    # it leaves the client's own bodies nothing to reuse; prefixgate moves the clock out
    assert 0.0 == s["none"] == s["positional"] < s["prefixgate"]


def test_schedule_is_seeded_and_spaced_10_to_30_seconds(runs) -> None:  # type: ignore[no-untyped-def]
    cfg = SimConfig()
    ev = schedule(runs, cfg)
    assert ev == schedule(runs, cfg)
    assert len(ev) == sum(len(r.requests) for r in runs)
    for (t1, r1, k1), (t2, r2, k2) in itertools.pairwise(ev):
        assert t2 > t1
        if r1 == r2:
            assert k2 == k1 + 1 and 10.0 <= t2 - t1 <= 30.0


def test_volatile_clock_shows_the_simulated_time(runs) -> None:  # type: ignore[no-untyped-def]
    body = client_body(runs[0], 0, 3725.0, SimConfig(provider="openai", volatile_clock=True))
    assert "The current time is 2024-05-15 16:02:05 EST." in body["messages"][0]["content"]
    fixed = client_body(runs[0], 0, 3725.0, SimConfig(provider="openai"))
    assert "The current time is 2024-05-15 15:00:00 EST." in fixed["messages"][0]["content"]


def test_anthropic_client_bodies_alternate_roles_and_pair_tool_results(runs) -> None:  # type: ignore[no-untyped-def]
    run = runs[0]
    req = run.requests[-1]
    body = to_anthropic("claude-sonnet-4-5", run.tools, req.messages)
    assert isinstance(body["system"], str) and body["system"].startswith("# Airline Agent Policy")
    roles = [m["role"] for m in body["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    msgs = body["messages"]
    for i, m in enumerate(msgs):
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if uses:
            results = [b["tool_use_id"] for b in msgs[i + 1]["content"]
                       if b["type"] == "tool_result"]
            assert results[:len(uses)] == uses
    assert {t["name"] for t in body["tools"]} == {t["function"]["name"] for t in run.tools}


def test_positional_marks_system_and_last_block_only(runs) -> None:  # type: ignore[no-untyped-def]
    body = client_body(runs[0], 3, 0.0, SimConfig(provider="anthropic"))
    out = positional(body, "anthropic")
    marks = json.dumps(out).count('"cache_control"')
    assert marks == 2
    assert out["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" in out["messages"][-1]["content"][-1]
    assert "cache_control" not in json.dumps(body)  # the client's body is not mutated
    assert positional(body, "openai") is body


def test_swe_agent_trajectory_replays_with_history_edits() -> None:
    (run,) = load_trace(SWE)
    assert len(run.requests) == 13 and run.tools
    for req in run.requests:
        for m in req.messages:
            if m["role"] == "tool":
                assert isinstance(m["tool_call_id"], str) and "tool_call_ids" not in m
    fig = Simulator(SimConfig(provider="radix", strategies=("none",))).run([run])
    assert fig["strategies"]["none"]["cached_share"] > 0.3
    # SWE-agent's last-5-observations processor rewrites old tool outputs
    assert fig["strategies"]["none"]["breaks"].get("history_edit", 0) > 0


def test_cli_json_shape() -> None:
    res = CliRunner().invoke(app, ["simulate", str(TRACE), "--runs", "1", "--provider",
                                   "anthropic", "--json"])
    assert res.exit_code == 0, res.output
    fig = json.loads(res.output)
    assert set(fig["strategies"]) == {"none", "positional", "prefixgate"}
    for s in fig["strategies"].values():
        assert {"cached_share", "cost_usd", "write_tokens", "breaks"} <= set(s)
    bad = CliRunner().invoke(app, ["simulate", str(TRACE), "--provider", "gemini"])
    assert bad.exit_code == 2
