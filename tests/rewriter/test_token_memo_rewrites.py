"""Rewriting with the process-wide token memo gives the bytes a rewrite with the plain counter
gives, turn after turn: on append-only agent conversations (the memo answers for the resent
prefix) and on conversations edited in the middle (the edited text misses the memo and is
counted afresh) (issue 25; :class:`prefixgate.rewriter.token_memo.TokenMemo`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings
from prefixgate.rewriter.analysis.tokens import count_tokens
from prefixgate.rewriter.pipeline import rewrite_request, session_updates, wire_bytes
from prefixgate.rewriter.token_memo import TokenMemo
from prefixgate.rewriter.types import Context
from tests.trace_requests import tau_requests

MOVES: dict = {**{name: True for name in MOVES_THE_MODEL_READS}, "tool_order": "name"}
"""Every pass that can change bytes on these sessions (constant clocks, constant tools): the
opt-in moves and the stateless tool order, which re-keys every request's tools."""
RUNS = tau_requests()[:4]


def _turns(counter: Any, bodies: list[dict[str, Any]]) -> list[bytes]:
    memory: dict[str, Any] = {}
    out = []
    for k, body in enumerate(bodies):
        ctx = Context(settings=RewriteSettings(**MOVES), model="gpt-4o", provider="anthropic",
                      session_id="s", session=MappingProxyType(dict(memory)),
                      now_s=1_800_000_000.0 + 30 * k, count_tokens=counter)
        res = rewrite_request(body, "openai", ctx)
        memory.update(session_updates(res))
        out.append(wire_bytes(res.body))
    return out


def _edited(body: dict[str, Any], at: int, text: str) -> dict[str, Any]:
    msgs = [dict(m) for m in body["messages"]]
    i = at % len(msgs)
    if isinstance(msgs[i].get("content"), str):
        msgs[i]["content"] = msgs[i]["content"] + text
    return {**body, "messages": msgs}


@settings(max_examples=8, deadline=None)
@given(run=st.integers(0, len(RUNS) - 1), turns=st.integers(1, 5),
       edit_at=st.none() | st.integers(1, 40), text=st.text(min_size=1, max_size=80))
def test_memo_counts_give_the_plain_counters_bytes(run: int, turns: int, edit_at: int | None,
                                                   text: str) -> None:
    bodies = RUNS[run][:turns]
    if edit_at is not None:  # a middle message edited from the second half on
        bodies = bodies[:1] + [_edited(b, edit_at, text) for b in bodies[1:]]
    memo = TokenMemo(count_tokens)
    _turns(memo, RUNS[run][:2])  # warm: an earlier conversation's texts are in the memo
    assert _turns(memo, bodies) == _turns(count_tokens, bodies)
    assert memo.hits > 0
