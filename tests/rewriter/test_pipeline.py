"""Pipeline contract: opt-out, determinism, fail-open per pass, summaries, B06 on real data."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from prefixgate.rewriter.pipeline import PASSES, PassSpec, rewrite_request, run_passes
from prefixgate.rewriter.types import Context, Edit, RewriteResult
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Prompt
from prefixgate.rewriter.wire.validate import introduced
from tests.rewriter.helpers import ctx, replay
from tests.trace_requests import anthropic_fixture_bodies, swe_requests, tau_requests

B06 = {"model": "claude-x", "max_tokens": 128,
       "tools": [{"name": "get_weather", "description": "d", "input_schema": {
           "type": "object", "properties": {"city": {"type": "string"}}}},
                 {"name": "send_email", "description": "d", "input_schema": {"type": "object"}}],
       "messages": [
           {"role": "user", "content": "Weather in Oslo?"},
           {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_A",
                                              "name": "get_weather", "input": {"city": "Oslo"}}]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_A",
                                         "content": "3C"},
                                        {"type": "text", "text": "Now write a haiku about it."}]}]}


def test_disabled_pipeline_returns_the_same_body_object() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "Now: 2025-03-04 10:15"},
                                       {"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx(enabled=False))
    assert r.body is body and not any(e.applied for e in r.edits)
    assert r.summary() == "none" and len(r.stable_prefix_hash) == 64


def test_rewriting_is_deterministic_for_the_same_input_and_session() -> None:
    run = tau_requests(runs=[3])[0][:6]
    a = replay(run, "openai", provider="openai", openai_prompt_cache_key=True)
    b = replay(run, "openai", provider="openai", openai_prompt_cache_key=True)
    assert [json.dumps(x.body) for x in a] == [json.dumps(x.body) for x in b]
    assert [x.edits for x in a] == [x.edits for x in b]


def test_input_body_is_never_mutated() -> None:
    body = json.loads(json.dumps(B06))
    before = json.dumps(body)
    rewrite_request(body, "anthropic", ctx("anthropic"))
    assert json.dumps(body) == before


def _drop_tool_results(prompt: Prompt, c: Context) -> tuple[Prompt, list[Edit]]:
    msgs = tuple(m.with_blocks([b for b in m.blocks if b.type != "tool_result"])
                 for m in prompt.messages)
    return replace(prompt, messages=msgs), [Edit("bad", True, "messages", "dropped")]


def _raises(prompt: Prompt, c: Context) -> tuple[Prompt, list[Edit]]:
    raise RuntimeError("boom")


@pytest.mark.parametrize("fn,why", [(_drop_tool_results, "output invalid"),
                                    (_raises, "pass failed")])
def test_a_pass_that_breaks_the_request_is_reverted_fail_open(fn: Any, why: str) -> None:
    passes = (PassSpec("bad", "enabled", "x", fn),) + PASSES
    prompt = wire.parse(B06, "anthropic")
    out, edits = run_passes(prompt, ctx("anthropic"), passes)
    assert edits[0].pass_name == "bad" and not edits[0].applied and why in edits[0].detail
    assert [m.blocks[0].type for m in out.messages] == ["text", "tool_use", "tool_result"]
    assert RewriteResult({}, edits).summary().endswith("!bad")


def test_summary_names_applied_passes_and_pruned_tokens() -> None:
    r = RewriteResult({}, [Edit("canonicalize_tools", True, "tools", "x"),
                           Edit("hoist_volatile", True, "system", "a", 5, 5),
                           Edit("hoist_volatile", True, "system", "b", 5, 5),
                           Edit("prune_tools", True, "tools", "c", 900, 100),
                           Edit("place_breakpoints", False, "messages", "nothing")])
    assert r.summary() == "canonicalize_tools;hoist_volatile:2;prune_tools-800"
    assert r.tokens_removed == 800


def test_no_pass_leaves_tool_blocks_without_definitions_b06() -> None:
    r = rewrite_request(B06, "anthropic", ctx("anthropic"))
    names = {t["name"] for t in r.body["tools"]}
    assert "get_weather" in names
    assert r.body["messages"][2]["content"][0]["type"] == "tool_result"


def _no_new_violations(body: dict[str, Any], r: RewriteResult, api: Any) -> None:
    """Valid output AND no pass reverted: the validator alone would hide a broken pass."""
    assert "!" not in r.summary(), [e.detail for e in r.edits if not e.applied]
    assert introduced(wire.parse(body, api), wire.parse(r.body, api)) == []


def test_real_anthropic_fixtures_stay_valid_after_rewriting() -> None:
    for body in anthropic_fixture_bodies():
        _no_new_violations(body, rewrite_request(body, "anthropic", ctx("anthropic")), "anthropic")


def test_real_agent_traces_stay_valid_and_tools_stay_defined() -> None:
    bodies = [b for run in tau_requests(runs=[0, 7, 42]) for b in run] + swe_requests()
    for body in bodies:
        r = rewrite_request(body, "openai", ctx("openai", openai_prompt_cache_key=True))
        _no_new_violations(body, r, "openai")
        out = r.body
        used = {tc["function"]["name"] for m in out["messages"] for tc in m.get("tool_calls") or []}
        assert used <= {t["function"]["name"] for t in out["tools"]}
