"""hoist_volatile runs only when it pays (issue 8, class 8; rule in ``prefixgate/rewriter/analysis/pays.py``)."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.config.cache_rules import RADIX_MIN_CACHEABLE_TOKENS, min_cacheable_for
from prefixgate.rewriter.analysis.pays import count_upto
from prefixgate.rewriter.analysis.tokens import count_tokens
from tests.rewriter.helpers import replay

CLOCK = "Current time: 2025-03-04 10:15:00 UTC."
RULE = "Rule: answer briefly, cite the policy section, and never guess a booking code.\n"


def _chat(system: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "What time is it?"}]}


def _hoist(r: Any) -> Any:
    return next(e for e in r.edits if e.pass_name == "hoist_volatile")


def _seen_changing(body: dict[str, Any], api: str, provider: str, model: str = "") -> Any:
    """The rewrite of ``body`` as the second request of a session whose clock changed (the
    first request had ``10:14``): the clock is then seen changing, so only whether it pays
    decides."""
    earlier = json.loads(json.dumps(body).replace("10:15:00", "10:14:00"))
    return replay([earlier, body], api, provider, model=model)[1]  # type: ignore[arg-type]


def test_issue_example_two_message_chat_with_a_timestamp_goes_out_unchanged() -> None:
    body = _chat(f"You are a helpful assistant. {CLOCK}")
    for provider in ("radix", "openai"):
        r = _seen_changing(body, "openai", provider)
        assert r.body is body and r.summary() == "none"
        assert "does not pay" in _hoist(r).detail


def test_anthropic_prefix_below_the_model_minimum_is_left_alone_and_above_it_is_hoisted() -> None:
    floor = min_cacheable_for("anthropic", "claude-sonnet-4-5")
    per_rule = count_tokens(RULE)

    def body(rules: int) -> dict[str, Any]:
        return {"model": "claude-sonnet-4-5", "max_tokens": 9, "system": CLOCK + "\n" + RULE * rules,
                "messages": [{"role": "user", "content": "hi"}]}
    short = _seen_changing(body(floor // per_rule // 2), "anthropic", "anthropic", "claude-sonnet-4-5")
    assert f"below the minimum cacheable length of {floor}" in _hoist(short).detail
    assert "2025-03-04" in short.body["system"]
    long = _seen_changing(body(2 * floor // per_rule), "anthropic", "anthropic", "claude-sonnet-4-5")
    assert _hoist(long).applied and "2025-03-04" not in str(long.body["system"])


def test_a_clock_on_the_last_system_line_is_not_moved_when_the_note_costs_more() -> None:
    body = _chat(RULE * 200 + CLOCK)  # long stable prefix, but nothing stable after the clock
    r = _seen_changing(body, "openai", "radix")
    assert r.body is body
    assert "makes only" in _hoist(r).detail


def test_the_radix_floor_is_one_kv_block() -> None:
    assert min_cacheable_for("radix", "anything") == RADIX_MIN_CACHEABLE_TOKENS == 16


def test_deciding_counts_a_bounded_share_of_a_huge_prompt() -> None:
    counted: list[int] = []

    def counter(text: str) -> int:
        counted.append(len(text))
        return count_tokens(text)
    big = RULE * 200_000  # ~16 MB
    assert count_upto([big], 2_000, counter) >= 2_000
    assert sum(counted) < len(big) // 100


def test_a_short_text_document_counts_as_its_text_not_as_an_opaque_media_block() -> None:
    # the fuzzer's class: two short text documents were counted as 2 x 1000 media tokens, so a
    # 700-byte prompt looked past Anthropic's 1024-token floor and was hoisted
    doc = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "refund policy, section 2"}]}}
    text_doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                               "data": "flights booked online"}}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 9, "system": CLOCK + "\n" + RULE,
            "messages": [{"role": "user", "content": [doc, text_doc, {"type": "text", "text": "hi"}]}]}
    r = _seen_changing(body, "anthropic", "anthropic", "claude-sonnet-4-5")
    assert "below the minimum cacheable length" in _hoist(r).detail
    assert r.body["system"] == body["system"]


def test_a_pdf_document_still_counts_as_an_opaque_media_block() -> None:
    from prefixgate.rewriter.analysis.pays import OPAQUE_BLOCK_TOKENS, document_text

    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}
    assert document_text(pdf) is None and OPAQUE_BLOCK_TOKENS == 1_000
    assert document_text({"type": "document", "title": "T", "source": {
        "type": "content", "content": "body"}}) == "T\nbody"
