"""prune_rag and passage detection: whole passages, ids intact, canonical order, dedupe."""

from __future__ import annotations

import re
from typing import Any

from prefixgate.rewriter.analysis.passages import find_passages, splice
from prefixgate.rewriter.passes.prune_rag import run, select_passages
from prefixgate.rewriter.wire import codec as wire
from tests.rewriter.helpers import ctx, replay

TOPICS = {
    "1": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, built in 1889. ",
    "2": "Bananas are elongated edible fruit produced by flowering plants of the genus Musa. ",
    "3": "Mount Everest is Earth's highest mountain above sea level, in the Himalayas. ",
    "4": "The Great Barrier Reef is the world's largest coral reef system, off Australia. ",
    "5": "Python is a high-level general-purpose programming language created by Guido. ",
}


def tagged(order: list[str], dup_of: str | None = None) -> str:
    docs = [f'<document id="{i}">{TOPICS[i] * 8}</document>' for i in order]
    if dup_of:
        docs.append(f'<document id="9">{TOPICS[dup_of] * 8} (mirror)</document>')
    return "Use the documents.\n<documents>\n" + "\n".join(docs) + "\n</documents>\n"


def user_body(text: str) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": [{"role": "user", "content": text}]}


def sent_ids(body: dict[str, Any]) -> list[str]:
    text = "".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
    return re.findall(r'<document id="(\d+)">', text)


def test_detects_tagged_numbered_and_delimited_passages() -> None:
    assert [p.pid for p in find_passages(tagged(["2", "1"]))] == ["2", "1"]
    numbered = "Sources:\n[1] alpha text\n[2] beta text\ncontinued\n[3] gamma\n\nQ: which?"
    found = find_passages(numbered)
    assert [p.pid for p in found] == ["1", "2", "3"]
    assert splice(numbered, found, [found[2]]) == "Sources:\n[3] gamma\n\nQ: which?"
    delim = "intro\n---\nA\n---\nB\n---\nQ?"
    assert [p.body for p in find_passages(delim, ["\n---\n"])] == ["A", "B"]
    assert find_passages(delim) == []
    assert find_passages("no passages <document>only one</document>") == []


def test_keeps_best_passages_whole_with_ids_in_canonical_order() -> None:
    q = "How tall is Mount Everest in the Himalayas mountain range?"
    body = user_body(tagged(["5", "3", "1", "4", "2"]) + q)
    res = replay([body], "openai", prune_rag=True, rag_budget_tokens=160)[0]
    ids = sent_ids(res.body)
    assert "3" in ids and len(ids) < 5 and ids == sorted(ids, key=int)
    content = res.body["messages"][0]["content"]
    assert content.endswith(q) and content.startswith("Use the documents.")
    for i in ids:  # whole passages, byte for byte
        assert f'<document id="{i}">{TOPICS[i] * 8}</document>' in content
    edit = next(e for e in res.edits if e.pass_name == "prune_rag")
    assert edit.applied and edit.tokens_after < edit.tokens_before


def test_same_retrieval_in_any_order_gives_the_same_bytes() -> None:
    q = "Tell me about the coral reef off Australia."
    a = replay([user_body(tagged(["1", "2", "4", "3"]) + q)], "openai", prune_rag=True,
               rag_budget_tokens=200)[0]
    b = replay([user_body(tagged(["3", "4", "2", "1"]) + q)], "openai", prune_rag=True,
               rag_budget_tokens=200)[0]
    assert a.body == b.body and "4" in sent_ids(a.body)


def test_duplicates_under_budget_are_kept_byte_identical() -> None:
    q = "What is Python the programming language?"
    body = user_body(tagged(["5", "2", "5"], dup_of="5") + q)
    res = replay([body], "openai", prune_rag=True, rag_budget_tokens=100_000)[0]
    assert res.body is body


def test_over_budget_only_a_contained_copy_is_a_duplicate_not_a_similar_one() -> None:
    bodies = ["alpha beta gamma delta", "Alpha  beta gamma", "alpha beta gamma delta epsilon",
              "alpha beta gamma delta!"]
    sel = select_passages(["1", "2", "3", "4"], bodies, [10, 10, 10, 10], ["alpha"], budget=15)
    assert sel.duplicates == frozenset({0, 1})  # inside passage 3: no character lost
    assert 3 not in sel.duplicates  # similar, not contained: competes for the budget


def test_under_budget_without_duplicates_is_untouched() -> None:
    body = user_body(tagged(["1", "2"]) + "Where is the tower?")
    res = replay([body], "openai", prune_rag=True, rag_budget_tokens=100_000)[0]
    assert res.body is body


def _docs_message(citations: bool) -> dict[str, Any]:
    docs = []
    for i in ("1", "2", "3", "4"):
        d: dict[str, Any] = {"type": "document", "source": {
            "type": "text", "media_type": "text/plain", "data": TOPICS[i] * 8}, "title": f"doc {i}"}
        if citations:
            d["citations"] = {"enabled": True}
        docs.append(d)
    return {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": [
        *docs, {"type": "text", "text": "Which reef is the largest coral reef system?"}]}]}


def test_anthropic_document_blocks_pruned_but_cited_ones_never_moved() -> None:
    out, edits = run(wire.parse(_docs_message(False), "anthropic"),
                     ctx(prune_rag=True, rag_budget_tokens=200))
    blocks = wire.render(out)["messages"][0]["content"]
    titles = [b.get("title") for b in blocks if b["type"] == "document"]
    assert edits[0].applied and "doc 4" in titles and len(titles) < 4
    assert blocks[-1]["type"] == "text"
    body = _docs_message(True)
    out, edits = run(wire.parse(body, "anthropic"), ctx(prune_rag=True, rag_budget_tokens=200))
    assert not edits[0].applied and wire.render(out) == body


def test_tool_result_passages_are_scored_against_the_call_arguments() -> None:
    body = {"model": "gpt-x", "tools": [{"type": "function", "function": {
        "name": "search", "parameters": {"type": "object"}}}], "messages": [
        {"role": "user", "content": "help me"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "search", "arguments": "{\"q\": \"Everest mountain height\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": tagged(["1", "2", "3", "4"])}]}
    res = replay([body], "openai", prune_rag=True, rag_budget_tokens=120)[0]
    assert sent_ids(res.body) == ["3"]


def test_history_is_pruned_to_the_same_bytes_on_the_next_turn() -> None:
    first = user_body(tagged(["1", "2", "3", "4", "5"]) + "Where is the Eiffel tower?")
    second = {"model": "gpt-x", "messages": [*first["messages"],
              {"role": "assistant", "content": "In Paris."},
              {"role": "user", "content": "And what about bananas?"}]}
    r1, r2 = replay([first, second], "openai", prune_rag=True, rag_budget_tokens=150)
    assert r2.body["messages"][0] == r1.body["messages"][0]


def test_select_passages_always_keeps_the_best_one() -> None:
    sel = select_passages(["a", "b"], ["alpha beta", "gamma"], [500, 10], ["alpha"], 100)
    assert sel.kept == (0,) and sel.tokens_after == 500  # over budget alone, still kept
    sel = select_passages(["a", "b"], ["alpha beta", "gamma"], [500, 10], ["gamma"], 100)
    assert sel.kept == (1,)
