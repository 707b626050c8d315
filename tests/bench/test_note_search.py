"""``bench/note_search.py``: the note candidates of the answer-stability search (issue 36) and
how the search chooses among them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from bench.note_search import CLOCK_TOOL, candidate, figures, kv_line, names, split_note, worded

NOTE = "The current time is 2024-05-15 15:01:19 EST.\nRequest ID: req_1a2b"
BARE: dict[str, Any] = {"model": "m", "messages": [
    {"role": "system", "content": "You are an agent.\nBe brief."},
    {"role": "user", "content": "Cancel my trip."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "cancel", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "done"}]}


def test_moved_lines_become_key_value_pairs_and_other_lines_stay() -> None:
    assert kv_line("The current time is 2024-05-15 15:01:19 EST.") == ("current_time", "2024-05-15 15:01:19 EST")
    assert kv_line("Request ID: req_1a2b") == ("request_id", "req_1a2b")
    assert kv_line("Current date and time: 2024-05-15T15:01:03-05:00") == \
        ("current_date_and_time", "2024-05-15T15:01:03-05:00")
    assert kv_line("[1] the line around a placeholder") is None


def test_each_wording_carries_every_value() -> None:
    assert worded(NOTE, "line") == NOTE
    assert worded(NOTE, "kv") == "current_time: 2024-05-15 15:01:19 EST\nrequest_id: req_1a2b"
    assert worded(NOTE, "reminder") == f"<system-reminder>\n{NOTE}\n</system-reminder>"
    assert json.loads(worded(NOTE, "json")) == {"current_time": "2024-05-15 15:01:19 EST",
                                                "request_id": "req_1a2b"}
    assert worded(NOTE, "values") == "[2024-05-15 15:01:19 EST | req_1a2b]"
    with pytest.raises(ValueError):
        worded(NOTE, "shout")


def test_the_reusable_placements_leave_everything_before_the_note_as_sent() -> None:
    """What the next request repeats (every message before the note, and the last message's own
    text) is untouched by ``end``, ``in_last``, ``tool_pair`` and ``system_end``; the near
    misses change it (that is what they measure); ``bare`` itself is never edited."""
    keep = copy.deepcopy(BARE)
    for name in names():
        got = candidate(BARE, NOTE, name)
        placement = name.split("/")[0]
        msgs, old = got["messages"], BARE["messages"]
        if placement in ("end", "tool_pair", "system_end"):
            assert msgs[:len(old)] == old and len(msgs) > len(old)
        elif placement == "in_last":
            assert msgs[:-1] == old[:-1] and msgs[-1]["content"].startswith(old[-1]["content"] + "\n\n")
        else:
            assert msgs[:len(old)] != old, name
        assert "2024-05-15 15:01:19 EST" in json.dumps(msgs), name
    assert BARE == keep
    pair = candidate(BARE, NOTE, "tool_pair/kv")["messages"][-2:]
    assert pair[0]["tool_calls"][0]["function"]["name"] == CLOCK_TOOL
    assert pair[1] == {"role": "tool", "tool_call_id": "call_context", "content": worded(NOTE, "kv")}
    assert candidate(BARE, NOTE, "system_end/line")["messages"][-1] == {"role": "system", "content": NOTE}


def test_the_note_is_split_off_an_end_rewrite_and_nothing_else() -> None:
    sent = dict(BARE, messages=[*BARE["messages"], {"role": "user", "content": NOTE}])
    assert split_note(sent) == (BARE, NOTE)
    with pytest.raises(ValueError):
        split_note(BARE)  # the last message is a tool result: no note there


def _row(turn: int, kls: dict[str, float], shares: dict[str, tuple[int, int]]) -> dict[str, Any]:
    search = {n: {"kl_mean": kls.get(n, 0.5), "top1": 0.9, "nll_delta": 0.1, "missing": 0,
                  "changed": True} for n in names()}
    return {"turn": turn, "search": search,
            "variants": {"openai/reminder": {"kl_mean": 0.2, "top1": 0.8, "nll_delta": 0.2, "missing": 0}},
            "reuse": {**{f"search:{n}": list(shares.get(n, (80, 100))) for n in names()},
                      "openai/reminder": [80, 100]}}


def test_the_search_chooses_the_lowest_kl_among_the_candidates_that_keep_the_prefix() -> None:
    """``system_tail/line`` has the lowest KL but re-reads the history (cached 0.3 against
    0.8): out; ``in_last/json`` (0.79, within 0.02) is the lowest of the rest; its ratio to the
    rewriter's ``reminder`` (0.2) is 0.25, within the goal's half."""
    kls = {"system_tail/line": 0.001, "in_last/json": 0.05, "end/kv": 0.06}
    shares = {"system_tail/line": (30, 100), "in_last/json": (79, 100), "end/line": (77, 100)}
    rows = [_row(t, kls, shares) for t in (0, 1, 2, 3)]
    got = figures(rows, 0.02)
    assert got["best_turn3_on_cached_share"] == 0.8
    assert "system_tail/line" not in got["reusable"] and "end/line" not in got["reusable"]
    assert got["chosen"] == "in_last/json"
    assert got["kl_ratio_to_reminder"] == 0.25 and got["goal_half_of_reminder"] is True
    assert got["candidates"]["in_last/json"]["changed"] == 4 and got["requests"] == 4
    worse = figures([_row(t, {n: 0.15 for n in names()}, {}) for t in (0, 1, 2)], 0.02)
    assert worse["kl_ratio_to_reminder"] == 0.75 and worse["goal_half_of_reminder"] is False
