"""A tool added mid-session goes after the tools the session knows, wherever the client puts it
(issue 38 item 7: a new tool was ranked among the known ones, reshuffling the session's order — a
cache break prefixgate caused; the old test added the new tool last in the client's list, where a
stable sort hides the bug, and read the session memory instead of the order sent).

The dimension varied: where the new tools sit in the client's list (first, middle, last, spread),
how many are new, and the order the known ones arrive in. Checked on the body sent upstream.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.rewriter.pipeline import rewrite_request
from tests.rewriter.helpers import ctx


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}


def _body(names: list[str]) -> dict[str, Any]:
    return {"model": "m", "tools": [_tool(n) for n in names],
            "messages": [{"role": "user", "content": "go"}]}


def _sent(names: list[str], session: dict[str, Any]) -> list[str]:
    out = rewrite_request(_body(names), "openai", ctx(session=session))
    return [t["function"]["name"] for t in out.body["tools"]]


def _memory(names: list[str]) -> dict[str, Any]:
    first = rewrite_request(_body(names), "openai", ctx())
    return next(e.memory for e in first.edits if e.memory.get("tool_order"))


KNOWN = ["k_read", "k_write", "k_search", "k_run"]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n_new=st.integers(1, 3))
def test_new_tools_go_after_the_known_ones_in_the_clients_order(data: st.DataObject, n_new: int) -> None:
    mem = _memory(KNOWN)
    new = [f"new_{i}" for i in range(n_new)]
    client = data.draw(st.permutations(KNOWN + new))  # known ones shuffled, new ones anywhere
    sent = _sent(list(client), mem)
    assert sent[:len(KNOWN)] == KNOWN  # the session's first-seen order, untouched
    assert sent[len(KNOWN):] == [n for n in client if n in new]  # then the new ones, client order


def test_a_new_tool_first_in_the_clients_list_does_not_move_the_known_ones() -> None:
    mem = _memory(KNOWN)
    assert _sent(["new_tool", *KNOWN], mem) == [*KNOWN, "new_tool"]
    assert _sent([KNOWN[0], "new_tool", *KNOWN[1:]], mem) == [*KNOWN, "new_tool"]
