"""DESIGN.md invariants as property tests, on generated requests of both APIs."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.pipeline import rewrite_request
from prefixgate.rewriter.types import RewriteResult
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api, Message, iter_blocks, tool_result_ids, tool_use_ids
from prefixgate.rewriter.wire.validate import introduced
from tests.rewriter.helpers import ctx, is_note, note_free, replay
from tests.rewriter.strategies import anthropic_requests, openai_requests

PROPS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLOCK_0, CLOCK_A, CLOCK_B = "2025-03-04 09:59:30", "2025-03-04 10:15:00", "2025-03-04 11:47:09"


def _rewrite(body: dict[str, Any], api: Api) -> dict[str, Any]:
    """``body`` rewritten as the second request of a session whose first request had another
    clock (so a clock in it is seen changing and moves)."""
    provider = "anthropic" if api == "anthropic" else "openai"
    r1, r = replay([_reclock(body, CLOCK_0), body], api, provider, openai_prompt_cache_key=True)
    _none_reverted(r1)
    _none_reverted(r)
    return r.body


def _none_reverted(r: RewriteResult) -> None:
    """The pipeline reverts an invalid pass output; on a valid input no pass may need that."""
    assert "!" not in r.summary(), [e.detail for e in r.edits if not e.applied]


def _turn(m: Message) -> tuple[str, list[str], list[str], list[str]]:
    texts = [note_free(b.text) for b in m.blocks if b.is_text and not is_note(b.text)]
    return m.role, texts, tool_use_ids(m), tool_result_ids(m)


def _check(body: dict[str, Any], api: Api) -> None:
    out = _rewrite(body, api)
    before, after = wire.parse(body, api), wire.parse(out, api)
    # turn order and content kept; at most one trailing note turn added
    assert len(after.messages) - len(before.messages) in (0, 1)
    for a, b in zip(before.messages, after.messages):
        ra, ta, ua, xa = _turn(a)
        rb, tb, ub, xb = _turn(b)
        assert (ra, ua, xa) == (rb, ub, xb)
        assert tb == ta
    # every request stays valid: pairs kept, no empty message, breakpoints <= 4
    assert introduced(before, after) == []
    marks = sum(1 for *_, n in iter_blocks(after) if n.cache_control is not None)
    assert marks <= max(4, sum(1 for *_, n in iter_blocks(before) if n.cache_control is not None))
    # deterministic
    assert json.dumps(_rewrite(body, api)) == json.dumps(out)


@PROPS
@given(openai_requests())
def test_openai_rewrites_keep_turns_pairs_validity_and_determinism(body: dict[str, Any]) -> None:
    _check(body, "openai")


@PROPS
@given(anthropic_requests())
def test_anthropic_rewrites_keep_turns_pairs_breakpoints_and_determinism(
        body: dict[str, Any]) -> None:
    _check(body, "anthropic")


def _skipped_as_not_paying(r: Any) -> bool:
    return any(e.pass_name == "hoist_volatile" and "does not pay" in e.detail for e in r.edits)


def _reclock(body: dict[str, Any], clock: str = CLOCK_B) -> dict[str, Any]:
    return json.loads(json.dumps(body).replace(CLOCK_A, clock))  # type: ignore[no-any-return]


def _ticking(body: dict[str, Any], api: Api, provider: str) -> tuple[RewriteResult, RewriteResult]:
    """Requests 2 and 3 of a session whose clock reads CLOCK_0, CLOCK_A, CLOCK_B."""
    _, a, b = replay([_reclock(body, CLOCK_0), body, _reclock(body)], api, provider)
    return a, b


@PROPS
@given(openai_requests(clock=CLOCK_A))
def test_openai_stable_prefix_survives_a_clock_change(body: dict[str, Any]) -> None:
    a, b = _ticking(body, "openai", "radix")
    if _skipped_as_not_paying(a) and _skipped_as_not_paying(b):
        return  # too short for the move to pay (issue 8, class 8): nothing added, reason given
    assert a.stable_prefix_hash == b.stable_prefix_hash
    assert a.body["messages"][:-1] == b.body["messages"][:-1]
    assert CLOCK_B in json.dumps(b.body["messages"][-1])


@PROPS
@given(anthropic_requests(clock=CLOCK_A))
def test_anthropic_stable_prefix_survives_a_clock_change(body: dict[str, Any]) -> None:
    a, b = _ticking(body, "anthropic", "anthropic")
    if _skipped_as_not_paying(a) and _skipped_as_not_paying(b):
        return  # below Anthropic's minimum cacheable length: nothing added, reason given
    assert a.stable_prefix_hash == b.stable_prefix_hash
    assert json.dumps(a.body["system"]) == json.dumps(b.body["system"])
    assert CLOCK_B in json.dumps(b.body["messages"][-1])


@PROPS
@given(anthropic_requests(clock=CLOCK_A))
def test_with_pruning_on_requests_stay_valid_and_deterministic(body: dict[str, Any]) -> None:
    c = ctx("anthropic", prune_history=True, history_high_watermark_tokens=30,
            history_low_watermark_tokens=10, prune_tools=True, prune_tools_min_catalog=2)
    out = rewrite_request(body, "anthropic", c)
    _none_reverted(out)
    before, after = wire.parse(body, "anthropic"), wire.parse(out.body, "anthropic")
    assert introduced(before, after) == []
    assert json.dumps(rewrite_request(body, "anthropic", c).body) == json.dumps(out.body)
    used = {b.tool_name for m in after.messages for b in m.blocks if b.type == "tool_use"}
    assert used <= {t.name for t in after.tools or ()}


@PROPS
@given(st.integers(0, 20), st.lists(st.text("abcdefgh0123", min_size=3, max_size=8),
                                    min_size=3, max_size=6, unique=True))
def test_a_line_that_keeps_changing_is_learned_and_leaves_the_prefix(
        line: int, values: list[str]) -> None:
    rules = [f"Rule {i}: keep answers short and factual." for i in range(31)]
    # lines 0..20: at least ten rules follow the live line, so moving it pays (class 8)

    def body(v: str) -> dict[str, Any]:
        lines = list(rules)
        lines[line] = f"Live counter: {v}"
        return {"model": "m", "messages": [{"role": "system", "content": "\n".join(lines)},
                                           {"role": "user", "content": "hi"}]}
    results = replay([body(v) for v in values], "openai")
    assert len({r.stable_prefix_hash for r in results[1:]}) == 1
    for r, v in zip(results[1:], values[1:]):
        assert f"Live counter: {v}" in r.body["messages"][-1]["content"]
        assert "Live counter" not in r.body["messages"][0]["content"]
