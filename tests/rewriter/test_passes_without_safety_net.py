"""Each pass's OWN output, with the pipeline's safety net off, on real agent requests.

``run_passes`` reverts a pass whose output breaks an API rule (fail-open), so a test that only
checks the pipeline's output for "no new violations" tests the validator, not the pass: a pass
that dropped a tool or ignored the client's breakpoints would simply not apply. These tests call
each pass's ``run`` directly and assert three things: it applied (its Edit), the concrete content
it must produce, and that its output is valid (:func:`prefixgate.rewriter.wire.validate.violations`). The last
test runs the whole pipeline on the tau-bench requests and asserts no pass was reverted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from prefixgate.rewriter.passes import (
    breakpoints,
    canonicalize_tools,
    hoist_volatile,
    prune_history,
    prune_rag,
    prune_tools,
)
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.types import Edit
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api, Prompt
from prefixgate.rewriter.wire.validate import cache_markers, violations
from tests.rewriter.helpers import ctx, replay
from tests.trace_requests import anthropic_fixture_bodies, tau_requests

TAU = [b for run in tau_requests(runs=[0, 7, 42]) for b in run]
HISTORY: dict[str, Any] = {"prune_history": True, "history_high_watermark_tokens": 2000,
           "history_low_watermark_tokens": 800}
ALL_ON: dict[str, Any] = {"prune_tools": True, "prune_tools_min_catalog": 2, "prune_rag": True,
          "rag_budget_tokens": 20, "tool_order": "name", **HISTORY}
HITS = "\n".join(f"[{i}] passage {i} about " + ("baggage allowance " if i == 3 else "weather ")
                 + "filler words " * 12 for i in range(1, 9))


def _valid(prompt: Prompt) -> Prompt:
    assert not violations(prompt), violations(prompt)
    return prompt


def _applied(edits: list[Edit], name: str) -> Edit:
    assert len(edits) == 1 and edits[0].pass_name == name and edits[0].applied, edits
    return edits[0]


def _tool_json(prompt: Prompt) -> Counter[str]:
    return Counter(json.dumps(t.raw, sort_keys=True) for t in prompt.tools or ())


def _called(prompt: Prompt) -> set[str]:
    return {b.tool_name or "" for m in prompt.messages for b in m.blocks if b.type == "tool_use"}


def test_canonicalize_tools_alone_sorts_and_keeps_every_tool_of_a_reversed_catalog() -> None:
    for body in TAU[:8]:
        prompt = _valid(wire.parse(dict(body, tools=body["tools"][::-1]), "openai"))
        out, edits = canonicalize_tools.run(prompt, ctx(tool_order="name"))
        _applied(edits, "canonicalize_tools")
        names = [t.name for t in out.tools or ()]
        assert names == sorted(t.name for t in prompt.tools or ())
        assert _tool_json(out) == _tool_json(prompt)  # same tools, same values: nothing dropped
        _valid(out)


def test_hoist_volatile_alone_moves_the_clock_out_of_the_system_prompt_into_a_final_note() -> None:
    clock = "Current time: 2026-12-01 10:15:00 UTC"
    apis: tuple[tuple[Api, str], ...] = (("openai", "openai"), ("anthropic", "anthropic"))
    for api, provider in apis:
        # a long stable part after the clock, so hoisting pays (the pass skips when it does not)
        sys = f"You are a helpful airline agent.\n{clock}\n" + "Answer briefly. " * 400
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "Change my seat."}]
        body: dict[str, Any] = {"model": "m", "max_tokens": 8, "system": sys, "messages": msgs} \
            if api == "anthropic" else \
            {"model": "m", "messages": [{"role": "system", "content": sys}, *msgs]}
        prompt = _valid(wire.parse(body, api))
        earlier = json.loads(json.dumps(body).replace("10:15:00", "10:14:00"))
        _, seen = hoist_volatile.run(wire.parse(earlier, api), ctx(provider))
        assert not any(e.applied for e in seen)  # not yet seen changing: left in place
        memory = {k: v for e in seen for k, v in e.memory.items()}
        out, edits = hoist_volatile.run(prompt, ctx(provider, session=memory))
        assert edits[0].pass_name == "hoist_volatile" and edits[0].applied
        rendered = wire.render(out)
        head = json.dumps(rendered.get("system") or rendered["messages"][0])
        tail = json.dumps(rendered["messages"][-1])
        assert "2026-12-01 10:15:00" not in head and "2026-12-01 10:15:00" in tail
        assert "You are a helpful airline agent." in head and "Answer briefly." in head
        _valid(out)


def test_prune_tools_alone_drops_tools_but_keeps_every_called_one_on_tau_requests() -> None:
    for body in TAU[::6]:
        prompt = _valid(wire.parse(body, "openai"))
        out, edits = prune_tools.run(prompt, ctx(prune_tools=True, prune_tools_min_catalog=2))
        e = _applied(edits, "prune_tools")
        kept = {t.name for t in out.tools or ()}
        assert 0 < len(kept) < len(prompt.tools or ()) and e.tokens_removed > 0
        assert _called(prompt) <= kept
        assert _tool_json(out) <= _tool_json(prompt)  # kept tools byte-for-byte unchanged
        _valid(out)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_prune_rag_alone_cuts_an_over_budget_tool_result_to_whole_passages(api: Api) -> None:
    call = {"id": "call_1", "name": "search_policy", "args": {"q": "baggage allowance"}}
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    if api == "openai":
        body: dict[str, Any] = {"model": "m", "tools": [{"type": "function", "function": {
            "name": call["name"], "parameters": schema}}], "messages": [
            {"role": "user", "content": "What is the baggage allowance?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call["id"], "type": "function", "function": {
                    "name": call["name"], "arguments": json.dumps(call["args"])}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": HITS}]}
    else:
        body = {"model": "m", "max_tokens": 8, "tools": [
            {"name": call["name"], "input_schema": schema}], "messages": [
            {"role": "user", "content": "What is the baggage allowance?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"],
                                               "name": call["name"], "input": call["args"]}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                          "content": HITS}]}]}
    prompt = _valid(wire.parse(body, api))
    out, edits = prune_rag.run(prompt, ctx(prune_rag=True, rag_budget_tokens=40))
    e = _applied(edits, "prune_rag")
    text = json.dumps(wire.render(out)["messages"][-1])
    assert "[3] passage 3 about baggage allowance" in text  # the relevant passage, whole
    assert 0 < text.count("passage ") < 8 and e.tokens_removed > 0
    assert len(out.messages) == len(prompt.messages)
    _valid(out)


def test_prune_history_alone_compacts_every_over_budget_tau_request_validly() -> None:
    over = 0
    for body in TAU:
        prompt = _valid(wire.parse(body, "openai"))
        c = ctx(**HISTORY)
        raw = prune_history.apply_plan(prompt.messages, prune_history.compact(
            prompt.messages, prune_history.stored_plan(prompt.messages, c), c), c)
        out, edits = prune_history.run(prompt, c)
        assert "would be invalid" not in edits[0].detail, edits[0].detail
        if not prune_history.will_compact(prompt, c):
            continue
        over += 1
        e = _applied(edits, "prune_history")
        assert e.tokens_after < e.tokens_before and e.tokens_before > 2000
        assert out.messages[0] == prompt.messages[0] and out.messages[-1] == prompt.messages[-1]
        _valid(out)
        _valid(replace(prompt, messages=tuple(raw)))  # the compaction itself
    assert over >= 20


def _anthropic_long(client_marks: int) -> dict[str, Any]:
    """A tau-sized Anthropic request (over the 4096-token minimum) with ``client_marks``
    client markers: on the last tool, the system block and the first user turn."""
    b = TAU[3]
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in b["tools"]]
    system = [{"type": "text", "text": b["messages"][0]["content"].replace(
        "2024-05-15 15:00:00 EST", "")}]
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "I want to cancel a flight."}]},
        {"role": "assistant", "content": "Which reservation?"},
        {"role": "user", "content": [{"type": "text", "text": "Reservation ZFA04Y."}]}]
    marks = [tools[-1], system[0], msgs[0]["content"][0]][:client_marks]
    for node in marks:
        node["cache_control"] = {"type": "ephemeral"}
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "tools": tools, "system": system,
            "messages": msgs}


@pytest.mark.parametrize("client_marks", [0, 1, 3])
def test_place_breakpoints_alone_keeps_every_client_marker_and_adds_within_four(
        client_marks: int) -> None:
    prompt = _valid(wire.parse(_anthropic_long(client_marks), "anthropic"))
    before = cache_markers(prompt)
    out, edits = breakpoints.run(prompt, ctx("anthropic", model="claude-sonnet-4-5"))
    _applied(edits, "place_breakpoints")
    after = cache_markers(out)
    assert set(before) <= set(after)  # the client's markers, at the same units
    assert len(before) < len(after) <= 4
    _valid(out)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_no_pass_is_reverted_on_real_agent_requests(provider: str) -> None:
    """Each run replayed as a session whose policy clock is the wall clock of each request (one
    minute apart), so hoist_volatile sees it changing (the trace's own line is constant)."""
    applied: Counter[str] = Counter()
    for run in tau_requests(runs=list(range(0, 160, 16))):
        bodies = [json.loads(json.dumps(b).replace("2024-05-15 15:00:00", f"2024-05-15 15:{k:02d}:00"))
                  for k, b in enumerate(run)]
        for r in replay(bodies, "openai", provider, model="gpt-4o", **ALL_ON):
            assert "!" not in r.summary(), r.summary()
            assert not [e for e in r.edits if "input kept" in e.detail or "invalid" in e.detail]
            applied.update(e.pass_name for e in r.edits if e.applied)
    assert {"canonicalize_tools", "hoist_volatile", "prune_tools", "prune_history"} <= set(applied)


def test_no_pass_is_reverted_on_the_recorded_anthropic_requests() -> None:
    for body in anthropic_fixture_bodies():
        r = rewrite_request(body, "anthropic", ctx("anthropic", **ALL_ON))
        assert "!" not in r.summary(), r.summary()
