"""The whole pipeline, every pass on, does linear work in messages, system lines and passages
(issue 8, class 2: 50,000 messages ~6 s, a 1M-line system prompt ~7 s, prune_rag re-walked the
history from every message). Work is counted in interpreter line events, not time."""

from __future__ import annotations

from typing import Any

import pytest

from prefixgate.rewriter.pipeline import rewrite_request
from tests.rewriter.helpers import ctx
from tests.rewriter.test_linear_scans import assert_linear

CLOCK = "Current time: 2026-12-01 05:29:04 UTC"
EVERY_PASS = {"prune_tools": True, "prune_history": True, "prune_rag": True,
              "history_high_watermark_tokens": 10**9, "history_low_watermark_tokens": 10**9}


def _messages(n: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CLOCK + "\n" + "Be brief.\n" * 20}]
    for i in range(n):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"})
    return {"model": "m", "messages": msgs + [{"role": "user", "content": "go"}]}


def _tool_results(n: int) -> dict[str, Any]:
    """Tool results with retrieved documents and no user text after the first turn: the shape
    that made prune_rag walk back to the first message from every result."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "find flights"}]
    for i in range(n):
        docs = "".join(f'<document index="{k}">flight {i} seat {k} fare</document>' for k in range(3))
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{i}", "type": "function", "function": {"name": "s", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": docs})
    return {"model": "m", "tools": [{"type": "function", "function": {"name": "s"}}],
            "messages": msgs}


def _system_lines(n: int) -> dict[str, Any]:
    system = CLOCK + "\n" + "\n".join(f"Rule {i}: answer briefly." for i in range(n))
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("shape", [_messages, _tool_results, _system_lines],
                         ids=["messages", "tool_results", "system_lines"])
def test_the_pipeline_with_every_pass_on_does_linear_work(shape: Any) -> None:
    c = ctx("openai", rag_budget_tokens=5, **EVERY_PASS)
    assert_linear(shape, lambda body: rewrite_request(body, "openai", c), n=300)


def _parallel_calls(n: int) -> dict[str, Any]:
    """One assistant turn with ``n`` parallel tool calls and their ``n`` results (a shape the
    issue does not name: the validators' pending list made it quadratic)."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "s", "arguments": "{}"}}
             for i in range(n)]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"r{i}"} for i in range(n)]
    return {"model": "m", "tools": [{"type": "function", "function": {"name": "s"}}],
            "messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": None, "tool_calls": calls}, *results]}


def _anthropic_parallel_calls(n: int) -> dict[str, Any]:
    uses = [{"type": "tool_use", "id": f"t{i}", "name": "s", "input": {}} for i in range(n)]
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "r"} for i in range(n)]
    return {"model": "claude-x", "max_tokens": 9, "tools": [{"name": "s", "input_schema": {}}],
            "messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": uses},
                         {"role": "user", "content": results}]}


def test_parallel_tool_calls_in_one_turn_cost_linear_work() -> None:
    c = ctx("openai", rag_budget_tokens=5, **EVERY_PASS)
    assert_linear(_parallel_calls, lambda body: rewrite_request(body, "openai", c), n=300)
    a = ctx("anthropic", rag_budget_tokens=5, **EVERY_PASS)
    # n = 600: both sizes above Anthropic's minimum cacheable prefix, so the breakpoint pass (and
    # the validation of its output) runs on both; at n = 300 it runs on the larger one only
    assert_linear(_anthropic_parallel_calls, lambda b: rewrite_request(b, "anthropic", a), n=600)
