"""prune_rag never deletes the user's own content, and nothing under budget (issue 8, class 3).

Only retrieved content is prunable: document / search_result blocks, tool results, and chunks a
retrieval layer tagged into a user message — and only when a retrieval exceeds its budget."""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.passes.prune_rag import run
from prefixgate.rewriter.wire import codec as wire
from tests.rewriter.helpers import ctx

CLAUSE = "The supplier shall deliver the goods within thirty days of the purchase order. " * 6


def user_only(text: str) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": [{"role": "user", "content": text}]}


def pruned(body: dict[str, Any], api: str = "openai", **settings: Any) -> dict[str, Any]:
    settings = {"prune_rag": True, "rag_delimiters": ["\n---\n"], **settings}
    out, _ = run(wire.parse(body, api), ctx(**settings))
    return wire.render(out)


def test_a_users_numbered_instruction_list_is_never_pruned() -> None:
    text = ("Please do both:\n[1] Rename the file report.txt to summary.txt\n"
            "[2] Rename the file report.txt to summary.md\n\nThanks")
    for budget in (1, 100_000):
        assert pruned(user_only(text), rag_budget_tokens=budget) == user_only(text)


def test_two_contract_versions_the_user_asks_to_compare_are_kept_under_budget() -> None:
    v1 = f'<document id="v1">{CLAUSE}</document>'
    v2 = f'<document id="v2">{CLAUSE.replace("thirty", "sixty", 1)}</document>'
    body = user_only(f"{v1}\n{v2}\nWhat changed between version 1 and version 2?")
    assert pruned(body, rag_budget_tokens=2000) == body


def test_120_listed_requirements_survive_even_a_tiny_budget() -> None:
    reqs = "\n---\n".join(f"REQ-{i:03d}: The system shall log event type {i}." for i in range(120))
    body = user_only("Check the design against these requirements:\n---\n" + reqs + "\n---\nGo.")
    assert pruned(body, rag_budget_tokens=5) == body


def test_a_users_own_result_and_context_notes_are_not_passages() -> None:
    text = ("<context>I am on macOS</context> <context>I use zsh</context>\n"
            "<result>it failed</result> <result>it failed again</result>\nWhy?")
    assert pruned(user_only(text), rag_budget_tokens=1) == user_only(text)


def test_anthropic_documents_under_budget_are_untouched_even_when_identical() -> None:
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                          "data": CLAUSE}, "title": "contract"}
    body = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": [
        doc, dict(doc), {"type": "text", "text": "Are these the same?"}]}]}
    assert pruned(body, "anthropic", rag_budget_tokens=100_000) == body


def test_a_tool_result_retrieval_over_budget_is_still_pruned() -> None:
    hits = "\n".join(f"[{i}] {'unrelated filler about gardening ' * 20}" for i in range(1, 9))
    hits += "\n[9] The Eiffel Tower is 330 metres tall."
    body = {"model": "gpt-x", "tools": [{"type": "function", "function": {"name": "search"}}],
            "messages": [
                {"role": "user", "content": "How tall is the Eiffel Tower?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "Eiffel Tower height"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": hits}]}
    sent = pruned(body, rag_budget_tokens=60)["messages"][2]["content"]
    assert "[9] The Eiffel Tower is 330 metres tall." in sent and len(sent) < len(hits)


def test_user_words_between_retrieved_chunks_survive_pruning_over_budget() -> None:
    text = (f'<document id="1">{CLAUSE}</document>\nCompare the delivery terms of this one\n'
            f'<document id="2">{CLAUSE.replace("goods", "parts")}</document>\nwith this one, and'
            f' ignore\n<document id="3">{"gardening tips " * 30}</document>\nthis last one.')
    sent = pruned(user_only(text), rag_budget_tokens=200)["messages"][0]["content"]
    assert len(sent) < len(text)  # something was pruned: the budget was exceeded
    for words in ("Compare the delivery terms of this one", "with this one, and ignore",
                  "this last one."):
        assert words in sent
