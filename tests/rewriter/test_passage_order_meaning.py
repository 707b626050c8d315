"""stabilise_passages leaves a retrieval whose order means something as sent, and finds
retrievals by their structure (issue 19, item 7; rules in ``prefixgate/rewriter/analysis/order_meaning.py``
and ``passage_forms.py`` form 6).

Each "left alone" case has a twin without the signal that *is* put back in first-seen order,
so a test fails if the signal is ignored and also if the pass stops reordering altogether."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prefixgate.rewriter.analysis.order_meaning import order_reason
from prefixgate.rewriter.analysis.passage_forms import find_retrieval, sibling_elements
from tests.rewriter.helpers import ctx, replay
from tests.rewriter.meaning import check_meaning

OLD = "Refund policy (2019 edition): refunds are paid within 90 days by cheque."
NEW = "Refund policy: refunds are paid within 5 days to the original card."
TEXTS = {"old": OLD, "new": NEW, "c": "Baggage: one checked bag of 23 kg is free on long-haul flights."}


def retrieval(form: str, keys: list[str]) -> str:
    """``keys`` as one retrieval in ``form``, each passage labelled by its key."""
    if form == "tag":
        return "\n".join(f'<document id="{k}">{TEXTS[k]}</document>' for k in keys)
    if form == "element":  # an application's own tag name
        return "\n".join(f'<kb_article id="{k}" lang="en">\n{TEXTS[k]}\n</kb_article>' for k in keys)
    if form == "header":
        return "\n".join(f"Document {k}: {TEXTS[k]}" for k in keys)
    if form == "json":
        return json.dumps([{"id": k, "content": TEXTS[k]} for k in keys], indent=1)
    return "\n".join(f"[{ {'old': 4, 'new': 9, 'c': 6}[k]}] {TEXTS[k]}" for k in keys)


def system_session(header: str, form: str, orders: list[list[str]],
                   instructions: str = "") -> list[dict[str, Any]]:
    return [{"model": "m", "messages": [
        {"role": "system", "content": f"You answer refund questions.{instructions}\n\n{header}\n"
                                      f"{retrieval(form, keys)}\n\nAnswer from these only."},
        {"role": "user", "content": "How are refunds paid?"}]} for keys in orders]


def tool_session(header: str, form: str, orders: list[list[str]], instructions: str = ""
                 ) -> list[dict[str, Any]]:
    call = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]
    return [{"model": "m", "messages": [
        {"role": "system", "content": f"You answer refund questions.{instructions}"},
        {"role": "user", "content": "How are refunds paid?"},
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "tool_call_id": "c1", "content": f"{header}\n{retrieval(form, keys)}"}]}
        for keys in orders]


FORMS = ["tag", "element", "header", "json", "numbered"]
ISSUE_HEADER = "Retrieved documents (most relevant first; trust the first one):"


@pytest.mark.parametrize("form", FORMS)
def test_the_issue_case_goes_out_as_the_client_sent_it(form: str) -> None:
    """turn 1 old,new; turn 2 new,old under "most relevant first; trust the first one"."""
    bodies = system_session(ISSUE_HEADER, form, [["old", "new"], ["new", "old"]])
    r2 = replay(bodies, "openai")[1]
    assert r2.body["messages"][0] == bodies[1]["messages"][0]
    assert "left in the client's order" in next(e.detail for e in r2.edits
                                                if e.pass_name == "stabilise_passages")


@pytest.mark.parametrize("form", FORMS)
def test_without_an_order_signal_the_same_retrieval_is_stabilised(form: str) -> None:
    bodies = system_session("Retrieved documents:", form, [["old", "new"], ["new", "old"]])
    r2 = replay(bodies, "openai")[1]
    sent = r2.body["messages"][0]["content"]
    assert sent.index(OLD) < sent.index(NEW)  # turn 1's order
    assert "stabilise_passages" in r2.summary()


@pytest.mark.parametrize("header", [
    "Search results (ranked by relevance):", "Results, sorted by date:", "Top 3 results:",
    "Policies, newest first:", "Sources in order of relevance:", "Best matches first:",
])
@pytest.mark.parametrize("where", ["system", "tool"])
def test_a_header_that_gives_the_order_a_meaning_keeps_it(header: str, where: str) -> None:
    session = system_session if where == "system" else tool_session
    bodies = session(header, "tag", [["old", "new", "c"], ["new", "c", "old"]])
    r2 = replay(bodies, "openai")[1]
    assert r2.body["messages"] == bodies[1]["messages"]


def test_instructions_about_ranking_cover_a_retrieval_in_a_tool_result() -> None:
    ranked = tool_session("Results:", "tag", [["old", "new"], ["new", "old"]],
                          " Search results are ranked; trust the first one.")
    assert replay(ranked, "openai")[1].body["messages"] == ranked[1]["messages"]
    plain = tool_session("Results:", "tag", [["old", "new"], ["new", "old"]],
                         " Search results may help.")
    sent = replay(plain, "openai")[1].body["messages"][3]["content"]
    assert sent.index(OLD) < sent.index(NEW)


@pytest.mark.parametrize(("texts", "why"), [
    ({"old": 'score="0.41" ' + OLD, "new": 'score="0.93" ' + NEW}, "ranks or scores"),
    ({"old": "Updated 2019-03-01. " + OLD, "new": "Updated 2024-11-20. " + NEW}, "dated"),
    ({"old": "Policy v1.2: " + OLD, "new": "Policy v3.0: " + NEW}, "versioned"),
    ({"old": OLD, "new": NEW + " This supersedes the 2019 edition."}, "supersedes"),
])
def test_ranked_dated_versioned_or_superseding_passages_keep_their_order(
        texts: dict[str, str], why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TEXTS, "old", texts["old"])
    monkeypatch.setitem(TEXTS, "new", texts["new"])
    bodies = system_session("Retrieved documents:", "tag", [["old", "new"], ["new", "old"]])
    r2 = replay(bodies, "openai")[1]
    assert r2.body["messages"][0] == bodies[1]["messages"][0]
    assert why in next(e.detail for e in r2.edits if e.pass_name == "stabilise_passages")


def test_order_reason_reads_each_signal_and_nothing_else() -> None:
    plain = ["alpha passage", "beta passage"]
    assert order_reason("Context:", plain) is None
    assert order_reason("ranked results:", plain) is not None
    assert order_reason("", plain, "Use the top 5 hits.") is not None
    assert order_reason("", ["rank: 1 alpha", "rank: 2 beta"]) == "the passages carry ranks or scores"
    assert order_reason("", ["15 May 2024 alpha", "May 16, 2024 beta"]) == "the passages are dated"
    assert order_reason("", ["version 2 alpha", "beta"]) is None  # one version is not an order


# -- retrievals found by structure ------------------------------------------------------------


@pytest.mark.parametrize("where", ["system", "tool"])
def test_passages_in_an_applications_own_tag_names_are_stabilised(where: str) -> None:
    session = system_session if where == "system" else tool_session
    bodies = session("Knowledge base articles:", "element", [["old", "new", "c"], ["c", "new", "old"]])
    r1, r2 = replay(bodies, "openai")
    idx = 0 if where == "system" else 3
    assert r2.body["messages"][idx]["content"] == r1.body["messages"][idx]["content"]
    check_meaning(bodies[1], r2.body, "openai", settings=ctx().settings)


@pytest.mark.parametrize("text", [
    "<kb_article>one</kb_article>\n<kb_article>two</kb_article>",  # no labels
    '<kb_article id="a">one</kb_article>\n<kb_article id="a">two</kb_article>',  # labels repeat
    '<kb_article id="a">one</kb_article>\n<kb_article id="b" lang="en">two</kb_article>',  # two shapes
    '<kb_article id="a">one</kb_article> then <kb_article id="b">two</kb_article>',  # content between
])
def test_elements_that_are_not_one_labelled_run_are_not_a_retrieval(text: str) -> None:
    assert sibling_elements(text) == [] and find_retrieval(text, "system") == []


def test_labelled_elements_in_a_users_own_message_need_a_retrieval_header() -> None:
    items = '<item id="a">milk</item>\n<item id="b">eggs</item>'
    assert find_retrieval(items, "user") == []
    assert [p.pid for p in find_retrieval("Retrieved context:\n" + items, "user")] == ["a", "b"]
    assert [p.pid for p in find_retrieval(items, "tool")] == ["a", "b"]
