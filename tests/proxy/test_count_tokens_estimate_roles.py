"""The count_tokens estimate charges every message its role markers (issue 38 item 3: the
per-message role tokens were left out; the only check accepted any count between 6 and 30).

The dimension varied: the number of messages (0 to 8), their content (text, blocks, empty), and
system / tools present or not. Exact: the estimate is the JSON-text tokens of system, messages
and tools (the rewriter's counter, the model's vocabulary) plus 4 per message, computed here
from its parts.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.proxy.api.count_tokens import estimate
from prefixgate.rewriter.analysis.tokens import encoding_for_model, json_tokens, make_counter

ROLE_TOKENS = 4
MODEL = "claude-sonnet-4-5"

contents = st.one_of(
    st.text(max_size=40),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}),
             max_size=3),
)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                           "content": contents}), max_size=8)


def _parts(body: dict[str, Any]) -> int:
    count = make_counter(encoding_for_model(MODEL))
    return sum(json_tokens(body[k], count) for k in ("system", "messages", "tools") if k in body)


@settings(max_examples=150, deadline=None)
@given(msgs=messages, system=st.one_of(st.none(), st.text(max_size=30)),
       tools=st.booleans())
def test_the_estimate_is_the_parts_plus_four_per_message(msgs: list[dict[str, Any]],
                                                         system: str | None, tools: bool) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": msgs}
    if system is not None:
        body["system"] = system
    if tools:
        body["tools"] = [{"name": "t", "input_schema": {"type": "object"}}]
    assert estimate(body) == _parts(body) + ROLE_TOKENS * len(msgs)


@settings(max_examples=60, deadline=None)
@given(msgs=messages.filter(bool))
def test_one_more_message_costs_its_text_and_its_role_markers(msgs: list[dict[str, Any]]) -> None:
    shorter = {"model": MODEL, "messages": msgs[:-1]}
    longer = {"model": MODEL, "messages": msgs}
    assert estimate(longer) - estimate(shorter) == _parts(longer) - _parts(shorter) + ROLE_TOKENS


def test_empty_messages_still_cost_their_role_markers() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 3}
    assert estimate(body) == _parts(body) + 12


@pytest.mark.parametrize("messages", ["absent", None, "xyz", {"role": "user", "content": "hi"}, 7])
def test_messages_that_are_not_a_list_cost_their_text_and_no_role_markers(messages: Any) -> None:
    """No list, no messages: nothing counts as a role marker (0 messages, not 1)."""
    body: dict[str, Any] = {"model": MODEL, "system": "abc"}
    if messages != "absent":
        body["messages"] = messages
    parts = _parts({k: v for k, v in body.items() if v is not None})
    assert estimate(body) == parts
