"""Breakpoint planner: each rule pinned with its source.

Source for every Anthropic rule: https://platform.claude.com/docs/en/build-with-claude/prompt-caching
(read 2026-11-29), constants in ``prefixgate/config/cache_rules.py``. OpenAI:
https://developers.openai.com/api/docs/guides/prompt-caching.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest

import prefixgate.config.cache_rules as rules
from prefixgate.rewriter.passes.breakpoints import conversation_key
from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import iter_blocks
from prefixgate.rewriter.wire.validate import violations
from tests.rewriter.helpers import clock_session, ctx, replay

BIG = "Static instructions about the product and its policies. " * 300  # ~3k tokens


def _markers(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    p = wire.parse(body, "anthropic")
    out = []
    for region, mi, bi, node in iter_blocks(p):
        if node.cache_control is not None:
            out.append((f"{region}[{mi}].{bi}", node.cache_control))
    return out


def _body(system: Any = BIG, msgs: list[dict[str, Any]] | None = None,
          model: str = "claude-sonnet-4-5", **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 32, "system": system,
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
            "messages": msgs or [{"role": "user", "content": "Hello"}], **extra}


def test_places_markers_at_system_end_and_newest_turn() -> None:
    out = rewrite_request(_body(), "anthropic", ctx("anthropic")).body
    where = [w for w, _ in _markers(out)]
    assert where == ["system[0].0", "messages[0].0"]


def test_no_marker_on_tools_below_the_minimum_cacheable_length() -> None:
    # rule: a prefix shorter than min_cacheable_tokens(model) is never cached
    r = rewrite_request(_body(), "anthropic", ctx("anthropic"))
    assert not any(w.startswith("tools") for w, _ in _markers(r.body))
    assert any("tools breakpoint skipped: prefix" in e.detail for e in r.edits)


@pytest.mark.parametrize("model,floor", [("claude-sonnet-4-5", 1024),
                                         ("claude-3-haiku-20240307", 2048),
                                         ("claude-haiku-4-5", 4096),
                                         ("claude-opus-4-5", 4096)])
def test_minimum_length_follows_the_dated_model_table(model: str, floor: int) -> None:
    from prefixgate.rewriter.analysis.tokens import count_tokens
    system = "Short policy text for the model. " * 180
    tokens = count_tokens(system)
    assert 1024 < tokens < 2048
    assert rules.min_cacheable_tokens(model) == floor
    r = rewrite_request(_body(system=system, model=model), "anthropic", ctx("anthropic"))
    assert bool(_markers(r.body)) is (tokens >= floor)


def test_client_markers_are_never_removed_and_total_stays_at_most_four() -> None:
    system = [{"type": "text", "text": BIG, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "short session note"}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a " * 50,
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "b",
                                          "cache_control": {"type": "ephemeral"}}]}]
    out = rewrite_request(_body(system=system, msgs=msgs), "anthropic", ctx("anthropic")).body
    marks = _markers(out)
    assert len(marks) <= 4
    for w in ("system[0].0", "messages[0].0", "messages[2].0"):
        assert w in [m for m, _ in marks]
    full = _body(system=system, msgs=msgs, tools=None)
    full["tools"] = [{"name": "calc", "input_schema": {"type": "object"},
                      "cache_control": {"type": "ephemeral"}}]
    r = rewrite_request(full, "anthropic", ctx("anthropic"))
    assert len(_markers(r.body)) == 4
    assert any("client uses all 4" in e.detail for e in r.edits)


def test_block_list_system_keeps_marker_and_shape_stream_or_not_b02() -> None:
    system = [{"type": "text", "text": BIG, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "short session note"}]
    a = rewrite_request(_body(system=system, stream=True), "anthropic", ctx("anthropic")).body
    b = rewrite_request(_body(system=system, stream=False), "anthropic", ctx("anthropic")).body
    assert isinstance(a["system"], list) and a["system"][0]["cache_control"]
    assert {k: v for k, v in a.items() if k != "stream"} == \
        {k: v for k, v in b.items() if k != "stream"}


def test_no_breakpoint_after_a_volatile_span_when_hoisting_is_off_b03() -> None:
    body = _body(system="Now: 2025-03-04 10:15.\n" + BIG)
    r = rewrite_request(body, "anthropic", ctx("anthropic", hoist_volatile=False))
    assert _markers(r.body) == []
    assert any("volatile from system[0]" in e.detail for e in r.edits)


def test_no_breakpoint_on_the_hoisted_note_block() -> None:
    out = clock_session(lambda m: _body(system=f"Now: 2025-03-04 10:{m}.\n" + BIG), ["14", "15"],
                        "anthropic", "anthropic")[1].body
    last = out["messages"][-1]["content"]
    assert "cache_control" in last[0] and "cache_control" not in last[-1]
    assert "10:15" in last[-1]["text"]


def test_consecutive_breakpoints_are_at_most_twenty_blocks_apart() -> None:
    # rule: the lookback checks at most 20 block boundaries before each breakpoint
    msgs: list[dict[str, Any]] = []
    for i in range(30):
        msgs += [{"role": "user", "content": f"question {i} " + "x " * 60},
                 {"role": "assistant", "content": f"answer {i}"}]
    msgs.append({"role": "user", "content": "last"})
    out = rewrite_request(_body(msgs=msgs), "anthropic", ctx("anthropic")).body
    idx = [i for i, (_, _, _, n) in enumerate(iter_blocks(wire.parse(out, "anthropic")))
           if n.cache_control is not None]
    assert len(idx) == 4
    assert all(b - a <= rules.ANTHROPIC_LOOKBACK_BLOCKS for a, b in pairwise(idx[1:]))


def test_previous_turn_write_is_re_marked_when_it_falls_out_of_the_lookback() -> None:
    first = [{"role": "user", "content": "start " * 10}]
    grown = first + [m for i in range(15) for m in (
        {"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"})]
    r1, r2 = replay([_body(msgs=first), _body(msgs=grown)], "anthropic", provider="anthropic")
    assert "messages[0].0" in [w for w, _ in _markers(r1.body)]
    assert "messages[0].0" in [w for w, _ in _markers(r2.body)]


def test_one_hour_ttl_markers_come_before_five_minute_ones() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi",
                                          "cache_control": {"type": "ephemeral"}}]}]
    out = rewrite_request(_body(msgs=msgs), "anthropic",
                          ctx("anthropic", breakpoint_ttl="1h")).body
    marks = _markers(out)
    assert marks[0] == ("system[0].0", {"type": "ephemeral", "ttl": "1h"})
    assert not violations(wire.parse(out, "anthropic"))
    client_1h = [{"role": "user", "content": [{"type": "text", "text": "hi",
                                               "cache_control": {"type": "ephemeral",
                                                                 "ttl": "1h"}}]}]
    out = rewrite_request(_body(msgs=client_1h), "anthropic", ctx("anthropic")).body
    assert _markers(out)[0][1].get("ttl") == "1h"  # ours upgraded to stay before the client's


def test_caching_beta_flags_are_planner_inputs_b20(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefixgate.rewriter.passes.breakpoints as bp
    monkeypatch.setattr(bp, "ANTHROPIC_TTL_1H_REQUIRES_BETA", True)
    without = rewrite_request(_body(), "anthropic", ctx("anthropic", breakpoint_ttl="1h"))
    assert all("ttl" not in cc for _, cc in _markers(without.body))
    with_beta = rewrite_request(_body(), "anthropic", ctx(
        "anthropic", betas=("context-1m-2025-08-07", bp.ANTHROPIC_TTL_1H_BETA),
        breakpoint_ttl="1h"))
    assert all(cc.get("ttl") == "1h" for _, cc in _markers(with_beta.body))


def test_automatic_caching_field_takes_one_of_the_four_slots() -> None:
    body = _body(cache_control={"type": "ephemeral"})
    out = rewrite_request(body, "anthropic", ctx("anthropic")).body
    assert out["cache_control"] == {"type": "ephemeral"} and len(_markers(out)) <= 3


def test_markers_only_for_the_anthropic_provider() -> None:
    body = _body()
    assert _markers(rewrite_request(body, "anthropic", ctx("radix")).body) == []


def test_openai_prompt_cache_key_is_one_key_per_conversation() -> None:
    """OpenAI routes by (first ~256 tokens, prompt_cache_key) and overflows a busy pair to cold
    machines: two conversations sharing a system prompt get two keys, each conversation's
    turns one key, and the session id itself never leaves (only a hash of it)."""
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": BIG},
                                            {"role": "user", "content": "hi"}]}

    def key(b: dict[str, Any], session_id: str, **kw: Any) -> dict[str, Any]:
        c = replace(ctx("openai", tenant="acme", **kw), session_id=session_id)
        return rewrite_request(b, "openai", c).body

    a1 = key(body, "conv-a", openai_prompt_cache_retention="24h")
    assert a1["prompt_cache_key"] == conversation_key("acme", "conv-a")
    assert a1["prompt_cache_key"].startswith("acme-") and "conv-a" not in a1["prompt_cache_key"]
    assert a1["prompt_cache_retention"] == "24h"
    assert list(a1)[:2] == ["model", "messages"]
    turn2 = dict(body, messages=[*body["messages"], {"role": "assistant", "content": "hello"},
                                 {"role": "user", "content": "more"}])
    assert key(turn2, "conv-a")["prompt_cache_key"] == a1["prompt_cache_key"]
    assert key(body, "conv-b")["prompt_cache_key"] != a1["prompt_cache_key"]
    mine = dict(body, prompt_cache_key="client-key", prompt_cache_retention="in_memory")
    kept = key(mine, "conv-a", openai_prompt_cache_retention="24h")
    assert kept["prompt_cache_key"] == "client-key" and kept["prompt_cache_retention"] == "in_memory"


def test_openai_prompt_cache_key_is_on_by_default_and_falls_back_to_the_prefix_hash() -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": BIG},
                                            {"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx("openai", tenant="acme"))
    assert r.body["prompt_cache_key"] == f"acme-{r.stable_prefix_hash[:16]}"
    off = rewrite_request(body, "openai", ctx("openai", openai_prompt_cache_key=False))
    assert "prompt_cache_key" not in off.body


def test_openai_compatible_local_backends_get_no_unknown_params() -> None:
    body = {"model": "local", "messages": [{"role": "user", "content": "hi"}]}
    r = rewrite_request(body, "openai", ctx("radix", openai_prompt_cache_key=True))
    assert "prompt_cache_key" not in r.body and json.dumps(r.body) == json.dumps(body)
