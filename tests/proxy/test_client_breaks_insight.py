"""The after-answer analysis records the CLIENT's breaks (issue 37, item 4): prefixgate's own
rewrite is never one, nor are one-shot requests under one session key; the backend's token ids
give the offset."""

from __future__ import annotations

from typing import Any

from prefixgate.proxy.observe.insight import Insight
from tests.cache.test_client_breaks import _body, _hoisted, _system


def _brk(insight: Insight, original: dict[str, Any], sent: dict[str, Any],
         ids: list[int] | None = None) -> dict[str, Any] | None:
    a = insight.observe(session="s", backend="b", provider="radix", api="openai", model="gpt-4o",
                        original=original, sent=sent, token_ids=ids if sent is original else None,
                        sent_ids=None if sent is original else ids)
    return a.brk


def test_the_hoist_moving_the_clock_is_recorded_as_the_clients_clock_not_a_system_edit() -> None:
    insight = Insight()
    b1 = _body(_system("22:31:05"), 1)
    assert _brk(insight, b1, b1) is None
    b2 = _body(_system("22:31:41"), 2)
    brk = _brk(insight, b2, _hoisted(b2))
    assert brk is not None and brk["kind"] == "volatile_span" and brk["line"] == 2
    assert brk["excerpt"] == "Current time: \u27e8datetime\u27e9"
    b3 = _body(_system("22:32:07"), 3)
    assert _brk(insight, b3, _hoisted(b3)) is None  # bridged by the rewrite: nothing lost


def test_readme_style_one_shots_under_one_session_are_no_breaks() -> None:
    insight = Insight()
    for body in ({"model": "m", "messages": [{"role": "user", "content": "Say hello"}]},
                 {"model": "m", "messages": [{"content": "Say hello", "role": "user"}]},
                 {"messages": [{"role": "user", "content": "Say hello"}], "model": "m",
                  "max_tokens": 16}):
        assert _brk(insight, body, body) is None


def test_engine_token_ids_give_the_offset_in_the_engines_unit() -> None:
    insight = Insight()
    b1, b2 = _body(_system("22:31:05"), 1), _body(_system("22:31:41"), 2)
    ids1 = list(range(1000, 1300))
    _brk(insight, b1, b1, ids1)
    brk = _brk(insight, b2, b2, ids1[:41] + list(range(2000, 2400)))
    assert brk is not None and brk["unit"] == "engine"
    assert brk["token_offset"] == 41 and brk["tokens_lost"] == 300 - 41
