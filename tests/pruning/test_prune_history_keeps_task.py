"""prune_history never drops the first user turn, and never counts media as base64 text
(issue 8, class 3)."""

from __future__ import annotations

import base64
from typing import Any

from prefixgate.rewriter.analysis.tokens import IMAGE_TOKENS, json_tokens
from prefixgate.rewriter.passes.prune_history import run
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import ctx, replay

FILLER = "lorem ipsum dolor sit amet " * 200  # ~1,000 tokens
BUDGET = dict(prune_history=True, history_high_watermark_tokens=4000,
              history_low_watermark_tokens=2500)
PHOTO = base64.b64encode(bytes(range(256)) * 2000).decode()  # 512 KB of image bytes


def long_chat(api: str, turns: int = 6) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "TASK: audit the ledger. " + FILLER}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": f"step {i} done " + FILLER})
        msgs.append({"role": "user", "content": f"continue with step {i + 1}"})
    body: dict[str, Any] = {"model": "m", "messages": msgs}
    if api == "anthropic":
        body["max_tokens"] = 64
    return body


def test_compaction_keeps_the_first_user_turn_and_the_newest() -> None:
    for api in ("openai", "anthropic"):
        body = long_chat(api)
        out, edits = run(wire.parse(body, api), ctx(**BUDGET))
        sent = wire.render(out)["messages"]
        assert edits[0].applied, edits
        assert sent[0] == body["messages"][0]
        assert sent[1] == body["messages"][1]  # the first turn whole: task and its answer
        assert sent[-1] == body["messages"][-1]
        assert len(sent) < len(body["messages"])
        assert not violations(out)


def test_remembered_compaction_keeps_the_first_turn_on_later_requests() -> None:
    first = long_chat("openai")
    second = dict(first, messages=[*first["messages"],
                                   {"role": "assistant", "content": "ok " + FILLER},
                                   {"role": "user", "content": "and the next?"}])
    results = replay([first, second], "openai", **BUDGET)
    for r, body in zip(results, (first, second)):
        assert r.body["messages"][0] == body["messages"][0]
    # append-only: the second request starts with the bytes of the first one (same plan)
    assert r.body["messages"][: len(results[0].body["messages"])] == results[0].body["messages"]


def test_a_plan_remembered_in_the_old_form_is_not_reused() -> None:
    body = long_chat("openai", turns=1)
    old = {"prune_history": {"drop": 2, "head": "x", "elide": [], "compactions": 1}}
    out, edits = run(wire.parse(body, "openai"), ctx(session=old, **BUDGET))
    assert not edits[0].applied and out.messages == wire.parse(body, "openai").messages


def image_chat(api: str) -> dict[str, Any]:
    if api == "openai":
        img: dict[str, Any] = {"type": "image_url",
                               "image_url": {"url": "data:image/png;base64," + PHOTO}}
    else:
        img = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": PHOTO}}
    body: dict[str, Any] = {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is on this photo?"}, img]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "what colour is it?"}]}
    if api == "anthropic":
        body["max_tokens"] = 64
    return body


def test_a_short_chat_with_a_large_image_is_not_pruned() -> None:
    for api in ("openai", "anthropic"):
        body = image_chat(api)
        out, edits = run(wire.parse(body, api), ctx(**BUDGET))
        assert not edits[0].applied, edits
        assert wire.render(out) == body


def test_an_image_inside_a_tool_result_counts_as_an_image_not_as_text() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PHOTO}}]}
    assert IMAGE_TOKENS <= json_tokens(result) < IMAGE_TOKENS + 100
    body = {"model": "m", "max_tokens": 64, "tools": [{"name": "shot", "input_schema": {}}],
            "messages": [
                {"role": "user", "content": "take a screenshot"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot",
                                                   "input": {}}]},
                {"role": "user", "content": [result]},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": "describe it"}]}
    out, edits = run(wire.parse(body, "anthropic"), ctx(**BUDGET))
    assert not edits[0].applied, edits


def test_audio_and_pdf_parts_count_at_their_fixed_cost() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": PHOTO, "format": "wav"}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": PHOTO}}
    text_doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                               "data": "short text"}}
    assert json_tokens(audio) < 1100
    assert json_tokens(pdf) < 3100
    assert json_tokens(text_doc) < 40


def test_over_budget_with_nothing_droppable_is_reported_unapplied_and_unchanged() -> None:
    body = {"model": "m", "messages": [
        {"role": "user", "content": "TASK " + FILLER * 5},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"}]}
    prompt = wire.parse(body, "openai")
    out, edits = run(prompt, ctx(**BUDGET))
    assert out is prompt and not edits[0].applied and "nothing may go" in edits[0].detail
    assert not edits[0].memory
