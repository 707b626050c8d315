"""Mid-conversation forms stay where the client put them (issue 35, item 2).

A system message inside ``messages``, ``tool_addition`` / ``tool_removal`` / ``tool_reference``
blocks, ``defer_loading`` tools and block types nobody knows yet: no pass moves, merges, prunes
or hoists them (the pipeline drops a pass output that does, :mod:`prefixgate.rewriter.wire.forms`),
and no breakpoint goes on a trailing system message (Claude Code #96101).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prefixgate.rewriter.passes.prune_tools import required_tools
from prefixgate.rewriter.pipeline import MOVED_FORM, PassSpec, rewrite_request, run_passes
from prefixgate.rewriter.types import Edit
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.forms import forms, trailing_system_start
from prefixgate.rewriter.wire.ir import Prompt
from tests.rewriter.helpers import ctx, replay

BIG = "Static instructions about the airline and its policies. " * 300  # ~3k tokens
TOOLS = [{"name": f"tool_{i}", "description": f"does thing {i}",
          "input_schema": {"type": "object"}} for i in range(8)]
ALL_ON: dict[str, Any] = {"prune_tools": True, "prune_tools_min_catalog": 2, "prune_rag": True,
                          "rag_budget_tokens": 20, "tool_order": "name", "prune_history": True,
                          "history_high_watermark_tokens": 200, "history_low_watermark_tokens": 100}
ADD = {"type": "tool_addition", "tool": {"name": "late_tool", "input_schema": {"type": "object"}}}
FUTURE = {"type": "some_future_block", "payload": {"x": 1}}


def _body(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": BIG,
            "tools": tools if tools is not None else TOOLS, "messages": msgs}


def _turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(n):
        out += [{"role": "user", "content": f"question {k} " + "detail " * 60},
                {"role": "assistant", "content": f"answer {k} " + "words " * 60}]
    return out


def _form_bytes(body: dict[str, Any]) -> list[str]:
    return [json.dumps(m, sort_keys=True) for m in body["messages"]
            if m.get("role") == "system" or (isinstance(m.get("content"), list) and any(
                b.get("type") in ("tool_addition", "some_future_block") for b in m["content"]))]


def test_a_trailing_system_message_never_gets_a_breakpoint() -> None:
    msgs = [*_turns(2), {"role": "user", "content": "now this"},
            {"role": "system", "content": [{"type": "text", "text": "Reminder: be brief."}]}]
    r = rewrite_request(_body(msgs), "anthropic", ctx("anthropic", model="claude-sonnet-4-5"))
    last = r.body["messages"][-1]
    assert "cache_control" not in json.dumps(last)
    # the newest stable block before it is marked instead
    assert "cache_control" in json.dumps(r.body["messages"][-2])
    assert any("trailing system message" in e.detail for e in r.edits)


def test_a_system_message_in_the_middle_may_carry_a_breakpoint_and_stays_put() -> None:
    msgs = [*_turns(1), {"role": "system", "content": "From now on answer in French."},
            *_turns(1)]
    body = _body(msgs)
    r = rewrite_request(body, "anthropic", ctx("anthropic", model="claude-sonnet-4-5", **ALL_ON))
    assert [m["role"] for m in r.body["messages"]].count("system") == 1
    i = [m["role"] for m in r.body["messages"]].index("system")
    assert r.body["messages"][i - 1]["role"] == "assistant"
    assert r.body["messages"][i + 1]["role"] == "user"
    assert "French" in json.dumps(r.body["messages"][i])


def test_every_pass_keeps_forms_in_place_over_a_session() -> None:
    """A long session (history pruning due) with an early system message, a tool_addition
    turn, a later system message and a future block: every form reaches the body as sent, in
    order, with the same neighbours; pruning still runs where it leaves them in place."""
    msgs = [*_turns(1), {"role": "system", "content": "Early policy: be formal."}, *_turns(6),
            {"role": "user", "content": [ADD, {"type": "text", "text": "use it"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "Policy update: refunds need approval."},
            {"role": "user", "content": [FUTURE, {"type": "text", "text": "and this?"}]}]
    bodies = [_body(msgs[:k]) for k in (15, 17, 18)]
    rs = replay(bodies, "anthropic", "anthropic", model="claude-sonnet-4-5", **ALL_ON)
    for body, r in zip(bodies, rs):
        assert forms(wire.parse(r.body, "anthropic")) == forms(wire.parse(body, "anthropic"))
        sent = _form_bytes(r.body)
        assert len(sent) == len(_form_bytes(body))
    assert "prune_history" in rs[0].summary()  # dropped old turns around the early form


def test_prune_tools_keeps_defer_loading_tools() -> None:
    deferred = {"name": "rare_tool", "description": "rarely used",
                "input_schema": {"type": "object"}, "defer_loading": True}
    prompt = wire.parse(_body(_turns(1), [*TOOLS, deferred]), "anthropic")
    assert "rare_tool" in required_tools(prompt, ctx("anthropic", **ALL_ON))


def _fold_system(prompt: Prompt, c: Any) -> tuple[Prompt, list[Edit]]:
    """A pass that does what broken gateways did: drop a mid-conversation system message
    (folding its text into the head would be the same change to the conversation)."""
    msgs = tuple(m for m in prompt.messages if m.role != "system")
    return replace(prompt, messages=msgs), [Edit("fold", True, "messages", "folded")]


def _swap_around_system(prompt: Prompt, c: Any) -> tuple[Prompt, list[Edit]]:
    """A pass that moves the system message one turn later."""
    ms = list(prompt.messages)
    i = next(k for k, m in enumerate(ms) if m.role == "system")
    ms[i], ms[i + 1] = ms[i + 1], ms[i]
    return replace(prompt, messages=tuple(ms)), [Edit("swap", True, "messages", "swapped")]


def test_the_pipeline_drops_a_pass_that_folds_or_moves_a_form() -> None:
    body = _body([*_turns(1), {"role": "system", "content": "Answer in French."},
                  {"role": "user", "content": "next"}, {"role": "assistant", "content": "ok"}])
    prompt = wire.parse(body, "anthropic")
    for fn in (_fold_system, _swap_around_system):
        spec = PassSpec(fn.__name__, "enabled", "tests", fn)
        out, edits = run_passes(prompt, ctx("anthropic"), (spec,))
        assert out is prompt, fn.__name__
        assert edits[0].detail == "output invalid, input kept: " + MOVED_FORM


def test_trailing_system_start() -> None:
    def p(roles: list[str]) -> Prompt:
        return wire.parse(_body([{"role": r, "content": "x"} for r in roles]), "anthropic")
    assert trailing_system_start(p(["user", "assistant", "user"])) == 3
    assert trailing_system_start(p(["user", "system", "system"])) == 1
    assert trailing_system_start(p(["user", "system", "user"])) == 3


def test_a_claude_code_shaped_session_keeps_its_cached_share() -> None:
    """Per-turn trailing system reminders, the client's own markers, a tool_addition turn
    (bench/mid_conversation_session.py): through prefixgate the session caches what it caches
    as sent, and folding the reminders into the system prompt would cache nothing."""
    from bench.mid_conversation_session import cached_share, session

    marked, bare = session(8, True), session(8, False)
    as_sent = cached_share(marked, "as_sent")
    assert as_sent > 0.7
    assert cached_share(marked, "prefixgate") >= as_sent
    assert cached_share(bare, "prefixgate") >= as_sent - 0.02
    assert cached_share(marked, "fold") < 0.1
