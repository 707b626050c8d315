"""The stable-region memo gives a full rewrite's bytes, turn after turn (issue 25;
:mod:`prefixgate.rewriter.region_memo`): on append-only agent conversations (the resent tools
hit the memo), on conversations whose tools are edited, reordered or re-keyed in the middle
(another key: the pass runs in full), and on bodies whose numbers keep their text (no memo).
Each comparison is against the same rewrite without a memo: body bytes, every Edit, the stable
prefix hash and the stage chain."""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings
from prefixgate.proxy.core import exactjson
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.pipeline import rewrite_request, session_updates, wire_bytes
from prefixgate.rewriter.region_memo import RegionMemo
from prefixgate.rewriter.token_memo import TokenMemo
from prefixgate.rewriter.types import Context, RewriteResult
from prefixgate.rewriter.wire import codec as wire
from tests.trace_requests import tau_requests

RUNS = tau_requests()[:6]
COUNTER = TokenMemo(count_tokens)


def _view(res: RewriteResult) -> tuple[Any, ...]:
    """Everything a caller reads of a result, as comparable values (stages rendered)."""
    stages = [(n, exactjson.dumps(wire.render(p)), a) for n, p, a in res.stages]
    return (exactjson.dumps(res.body), res.edits, res.stable_prefix_hash, stages)


def _session(bodies: list[dict[str, Any]], memo: RegionMemo | None, provider: str,
             **switches: Any) -> list[tuple[Any, ...]]:
    """Rewrite ``bodies`` as one session (memory merged like the proxy), with ``memo``."""
    memory: dict[str, Any] = {}
    out = []
    for k, body in enumerate(bodies):
        ctx = Context(settings=RewriteSettings(**switches), model="gpt-4o", provider=provider,
                      session_id="s", session=MappingProxyType(dict(memory)),
                      now_s=1_800_000_000.0 + 30 * k, count_tokens=COUNTER, memo=memo)
        res = rewrite_request(body, "openai", ctx)
        memory.update(session_updates(res))
        out.append(_view(res))
    return out


def _reordered(body: dict[str, Any], seed: int) -> dict[str, Any]:
    """``body`` with its tools in another order (the same values)."""
    tools = list(body["tools"])
    random.Random(seed).shuffle(tools)
    return {**body, "tools": tools}


def _rekeyed(body: dict[str, Any], at: int) -> dict[str, Any]:
    """``body`` with one tool's function keys in reverse order (the same values)."""
    tools = list(body["tools"])
    i = at % len(tools)
    fn = tools[i]["function"]
    tools[i] = {**tools[i], "function": dict(reversed(list(fn.items())))}
    return {**body, "tools": tools}


def _edited(body: dict[str, Any], at: int, text: str) -> dict[str, Any]:
    """``body`` with one tool's description changed (a tool edited in the middle)."""
    tools = list(body["tools"])
    i = at % len(tools)
    fn = dict(tools[i]["function"])
    fn["description"] = fn.get("description", "") + text
    tools[i] = {**tools[i], "function": fn}
    return {**body, "tools": tools}


SWITCHES = st.sampled_from([
    {},
    {"tool_order": "name"},
    {"tool_schema_sort_properties": True, "tool_order": "name"},
    {name: True for name in MOVES_THE_MODEL_READS},
])


@settings(max_examples=12, deadline=None)
@given(run=st.integers(0, len(RUNS) - 1), turns=st.integers(2, 6), switches=SWITCHES,
       provider=st.sampled_from(["openai", "anthropic", "radix"]))
def test_append_only_session_gives_the_full_rewrites_bytes(run: int, turns: int,
                                                           switches: dict[str, Any],
                                                           provider: str) -> None:
    bodies = RUNS[run][:turns]
    memo = RegionMemo()
    assert _session(bodies, memo, provider, **switches) == \
        _session(bodies, None, provider, **switches)
    assert memo.hits >= turns - 1  # every turn after the first reuses the tools' rewrite


@settings(max_examples=15, deadline=None)
@given(run=st.integers(0, len(RUNS) - 1), turns=st.integers(2, 6),
       change=st.lists(st.tuples(st.sampled_from(["edit", "reorder", "rekey", "same"]),
                                 st.integers(0, 40), st.text(min_size=1, max_size=20)),
                       min_size=6, max_size=6),
       switches=SWITCHES)
def test_edits_in_the_middle_fall_back_to_a_full_rewrite(run: int, turns: int,
                                                         change: list[tuple[str, int, str]],
                                                         switches: dict[str, Any]) -> None:
    bodies = []
    for body, (kind, at, text) in zip(RUNS[run][:turns], change):
        if kind == "edit":
            body = _edited(body, at, text)
        elif kind == "reorder":
            body = _reordered(body, at)
        elif kind == "rekey":
            body = _rekeyed(body, at)
        bodies.append(body)
    memo = RegionMemo()
    _session(RUNS[(run + 1) % len(RUNS)][:2], memo, "anthropic", **switches)  # warm entries
    assert _session(bodies, memo, "anthropic", **switches) == \
        _session(bodies, None, "anthropic", **switches)


def test_an_edited_tool_misses_and_is_rewritten_in_full() -> None:
    body = RUNS[0][1]
    memo = RegionMemo()
    _session([body], memo, "openai", tool_order="name")
    misses = memo.misses
    edited = _edited(body, 3, " (changed)")
    assert _session([edited], memo, "openai", tool_order="name") == \
        _session([edited], None, "openai", tool_order="name")
    assert memo.misses > misses  # the edited tool list is another key


def test_a_hit_hands_out_fresh_tools() -> None:
    """A request that changes its rewritten tools cannot change the next request's."""
    body = _reordered(RUNS[0][1], 7)
    memo = RegionMemo()
    first = rewrite_request(body, "openai", Context(RewriteSettings(tool_order="name"),
                                                    count_tokens=COUNTER, memo=memo))
    expected = wire_bytes(first.body)
    first.body["tools"][0]["function"]["name"] = "mutated"
    again = rewrite_request(body, "openai", Context(RewriteSettings(tool_order="name"),
                                                    count_tokens=COUNTER, memo=memo))
    assert memo.hits >= 1
    assert wire_bytes(again.body) == expected


@pytest.mark.parametrize("number", ["1.10", "1e5", "123456789012345678901234567890", "-0"])
def test_numbers_that_keep_their_text_are_not_memoized(number: str) -> None:
    raw = exactjson.dumps(_reordered(RUNS[0][1], 3))
    raw = raw.replace(b'"type":"object"', b'"type":"object","x-n":' + number.encode(), 1)
    memo = RegionMemo()
    views = [_view(rewrite_request(exactjson.loads(raw), "openai",
                                   Context(RewriteSettings(tool_order="name"),
                                           count_tokens=COUNTER, memo=memo)))
             for _ in range(2)]
    full = _view(rewrite_request(exactjson.loads(raw), "openai",
                                 Context(RewriteSettings(tool_order="name"),
                                         count_tokens=COUNTER)))
    assert views == [full, full]
    assert number.encode() in views[0][0]
    assert len(memo) == 0 and memo.hits == 0


def test_session_state_is_part_of_the_key() -> None:
    """The same tools under another session memory (first-seen order) are another key."""
    body = RUNS[0][1]
    memo = RegionMemo()
    a = _session([body, _reordered(body, 1)], memo, "openai")
    b = _session([_reordered(body, 1), body], memo, "openai")
    assert a == _session([body, _reordered(body, 1)], None, "openai")
    assert b == _session([_reordered(body, 1), body], None, "openai")
    assert a[1][0] != b[1][0]  # first-seen order differs: so does the second turn's bytes


def test_the_memo_stays_within_its_bytes() -> None:
    memo = RegionMemo(max_bytes=60_000)
    for seed in range(12):
        _session([_reordered(RUNS[0][1], seed)], memo, "openai", tool_order="name")
        assert memo.bytes <= memo.max_bytes
    assert 0 < len(memo) < 24  # older entries were evicted


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        RegionMemo(max_bytes=-1)


def test_settings_the_pass_reads_are_part_of_the_key() -> None:
    """One memo, one body, the switches canonicalize_tools reads changed between requests."""
    body = _rekeyed(_reordered(RUNS[0][1], 5), 2)
    memo = RegionMemo()
    for switches in ({"tool_order": "name"}, {"tool_order": "first_seen"},
                     {"tool_order": "name", "tool_schema_sort_properties": True},
                     {"tool_order": "name"}):
        assert _session([body, body], memo, "openai", **switches) == \
            _session([body, body], None, "openai", **switches)
