"""Property: every pruning pass, on its own, turns a valid request into a valid request.

The pipeline would revert an invalid pass output (fail-open), so these tests call each pass's
``run`` directly: a pass must not rely on that safety net.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.passes import prune_history, prune_rag, prune_tools
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import ctx
from tests.rewriter.strategies import anthropic_requests, openai_requests

PASSES = (prune_tools.run, prune_rag.run, prune_history.run)
SETTINGS: dict[str, Any] = {
    "prune_tools": True, "prune_tools_min_catalog": 1, "prune_rag": True, "rag_budget_tokens": 8,
    "prune_history": True, "history_high_watermark_tokens": 40,
    "history_low_watermark_tokens": 10}


def _add_passages(body: dict[str, Any], draw: st.DrawFn) -> None:
    """Put a small tagged retrieval into the first user string content."""
    for m in body["messages"]:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            n = draw(st.integers(0, 4))
            docs = "".join(f'<doc id="{i}">passage {i} {m["content"]}</doc>' for i in range(n))
            m["content"] = docs + m["content"]
            return


def _add_filler_tools(body: dict[str, Any], api: Api, n: int) -> None:
    """Grow the catalog past the keep floor so tool pruning has something to drop."""
    for i in range(n):
        schema = {"type": "object", "properties": {"shelf": {"type": "string"}}}
        name, desc = f"zz_filler_{i:02d}", f"Manage widget inventory shelf {i}"
        body["tools"].append(
            {"type": "function", "function": {"name": name, "description": desc,
                                              "parameters": schema}}
            if api == "openai" else {"name": name, "description": desc, "input_schema": schema})


@st.composite
def requests(draw: st.DrawFn) -> tuple[Api, dict[str, Any]]:
    api: Api = draw(st.sampled_from(["openai", "anthropic"]))
    body = draw(openai_requests() if api == "openai" else anthropic_requests())
    _add_passages(body, draw)
    _add_filler_tools(body, api, draw(st.integers(0, 16)))
    return api, body


def _first_turn_is_user(prompt: Any) -> bool:
    return not prompt.messages or prompt.messages[0].role == "user"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_pruning_pass_keeps_a_valid_request_valid(case: tuple[Api, dict[str, Any]]) -> None:
    api, body = case
    prompt = wire.parse(body, api)
    assert not violations(prompt)
    c = ctx(**SETTINGS)
    for run in PASSES:
        out, edits = run(prompt, c)
        assert not violations(out), (run.__module__, violations(out))
        # prune_history validates itself and returns its input when invalid: that must not happen
        assert not any("invalid" in e.detail for e in edits), edits
        if run is prune_history.run:
            plan = prune_history.stored_plan(prompt.messages, c)
            raw = prune_history.apply_plan(prompt.messages,
                                           prune_history.compact(prompt.messages, plan, c), c)
            assert not violations(replace(prompt, messages=tuple(raw)))
        assert edits and all(e.pass_name == run.__module__.split(".")[-1] for e in edits)
        rendered = wire.render(out)
        assert not violations(wire.parse(rendered, api))
        if run is prune_history.run:
            assert _first_turn_is_user(out) or not _first_turn_is_user(prompt)
            if out.messages:
                assert out.messages[-1] == prompt.messages[-1]
        prompt = out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_pruning_is_deterministic(case: tuple[Api, dict[str, Any]]) -> None:
    api, body = case
    outs = []
    for _ in range(2):
        prompt = wire.parse(body, api)
        for run in PASSES:
            prompt, _ = run(prompt, ctx(**SETTINGS))
        outs.append(wire.render(prompt))
    assert outs[0] == outs[1]
