"""The rewrite's recorded stage chain gives the attribution the very bodies a re-run of the
passes gives (:func:`prefixgate.proxy.observe.stages.recorded_bodies` vs
:func:`~prefixgate.proxy.observe.stages.stage_bodies`, issue 25), on real agent sessions."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Any

import pytest

from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings, switch_on
from prefixgate.proxy.observe.stages import PASS_NAMES, recorded_bodies, stage_bodies
from prefixgate.rewriter import pipeline
from prefixgate.rewriter.pipeline import rewrite_request, session_updates, wire_bytes
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Prompt
from tests.trace_requests import tau_requests

MOVES: dict = {**{name: True for name in MOVES_THE_MODEL_READS}, "tool_order": "name"}
"""Every pass that can change bytes on these sessions (constant clocks, constant tools): the
opt-in moves and the stateless tool order, which re-keys every request's tools."""


def _session(bodies: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Context, Any]]:
    """Each body rewritten in turn, session memory carried as the proxy carries it."""
    memory: dict[str, Any] = {}
    out = []
    for k, body in enumerate(bodies):
        ctx = Context(settings=RewriteSettings(**MOVES), model="gpt-4o", provider="anthropic",
                      session_id="s", session=MappingProxyType(dict(memory)),
                      now_s=1_800_000_000.0 + 60 * k)
        res = rewrite_request(body, "openai", ctx)
        memory.update(session_updates(res))
        out.append((body, ctx, res))
    return out


def _wire(stages: list[tuple[str, dict[str, Any]]] | None) -> list[tuple[str, bytes]] | None:
    return None if stages is None else [(n, wire_bytes(b)) for n, b in stages]


def test_recorded_stages_match_a_rerun_of_the_passes_on_a_real_session() -> None:
    runs = tau_requests()
    bodies = [b for run in runs[:3] for b in run[:6]]
    rewritten = 0
    for body, ctx, res in _session(bodies):
        assert [s[0] for s in res.stages] == [n for n in PASS_NAMES
                                             if switch_on(ctx.settings, n)]
        got = recorded_bodies(body, res.stages, res.body)
        want = stage_bodies(body, "openai", ctx, res.body, time.monotonic() + 60)
        assert _wire(got) == _wire(want)
        assert got is not None and wire_bytes(got[-1][1]) == wire_bytes(res.body)
        rewritten += res.body is not body
    assert rewritten > 0  # the sessions exercise applied passes, not only pass-through


def test_recorded_stages_that_do_not_end_in_what_was_sent_attribute_nothing() -> None:
    body, _, res = next((b, c, r) for b, c, r in _session([x for run in tau_requests()[:2]
                                                            for x in run[:4]])
                        if r.body is not b)
    other = {**res.body, "messages": res.body["messages"][:-1]}
    assert recorded_bodies(body, res.stages, other) is None


def _bad_pass(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Cuts the history right after the first tool call: the call is left unanswered."""
    from dataclasses import replace
    i = next(i for i, m in enumerate(prompt.messages) if any(b.type == "tool_use" for b in m.blocks))
    out = replace(prompt, messages=prompt.messages[:i + 1])
    return out, [Edit("bad", True, "all", "dropped messages")]


def _same_pass(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    return prompt, [Edit("same", True, "all", "claims a change it did not make")]


def test_a_dropped_pass_records_its_input_and_no_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    body = next(b for run in tau_requests() for b in run
                if any(m.get("role") == "tool" for m in b["messages"][2:]))
    specs = (pipeline.PassSpec("bad", "hoist_volatile", "tests", _bad_pass),
             pipeline.PassSpec("same", "stabilise_passages", "tests", _same_pass))
    prompt = pipeline.wire.parse(body, "openai")
    stages: list[pipeline.Stage] = []
    out, edits = pipeline.run_passes(prompt, Context(settings=RewriteSettings(**MOVES)), specs, stages)
    assert out is prompt
    assert [(n, p is prompt, a) for n, p, a in stages] == [("bad", True, False),
                                                          ("same", True, False)]
    assert edits[0].detail.startswith("output invalid") and not edits[1].applied
