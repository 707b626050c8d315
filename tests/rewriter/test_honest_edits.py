"""An edit is listed as applied only when the body its pass produced differs (issue 8, class 7)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefixgate.rewriter.pipeline import PassSpec, rewrite_request, run_passes
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Prompt
from tests.rewriter.helpers import ctx

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _claims(fn: Any) -> tuple[PassSpec, ...]:
    return (PassSpec("claimer", "enabled", "unused", fn),)


def test_a_pass_that_returns_an_equal_copy_is_not_listed_as_applied() -> None:
    def copy_and_claim(p: Prompt, c: Context) -> tuple[Prompt, list[Edit]]:
        return replace(p, messages=tuple(replace(m) for m in p.messages)), [
            Edit("claimer", True, "messages", "rewrote", memory={"k": 1})]

    out, edits = run_passes(wire.parse(BODY, "openai"), ctx(), _claims(copy_and_claim))
    assert [e.applied for e in edits] == [False]
    assert edits[0].memory == {"k": 1}  # what it learned is kept, only the claim is dropped


def test_a_pass_that_only_reorders_keys_counts_as_a_change() -> None:
    def reorder(p: Prompt, c: Context) -> tuple[Prompt, list[Edit]]:
        m = p.messages[0]
        raw = {"content": m.raw["content"], "role": m.raw["role"]}
        return replace(p, messages=(replace(m, raw=raw),)), [Edit("claimer", True, "messages", "x")]

    _, edits = run_passes(wire.parse(BODY, "openai"), ctx(), _claims(reorder))
    assert [e.applied for e in edits] == [True]


def test_a_request_no_pass_changes_reports_none_and_keeps_the_body_object() -> None:
    body = {"model": "m", "tools": [{"type": "function", "function": {"name": "a"}}],
            "messages": [{"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx())
    assert r.body is body and r.summary() == "none"
