"""prune_rag's budget at its boundary: passages that together fit EXACTLY are all kept, in their
own order; one token over and the best-first selection starts (``rewriter.prune_rag``)."""

from __future__ import annotations

from prefixgate.rewriter.analysis.bm25 import terms
from prefixgate.rewriter.passes.prune_rag import select_passages

IDS = ["3", "1", "4", "2"]  # the retriever's order, not the canonical one
BODIES = ["baggage allowance rules", "weather report", "seat map", "meal options"]
TOKENS = [10, 7, 5, 3]


def test_a_retrieval_exactly_at_budget_is_kept_whole_in_its_order() -> None:
    sel = select_passages(IDS, BODIES, TOKENS, terms("baggage allowance"), sum(TOKENS))
    assert sel.kept == (0, 1, 2, 3) and sel.tokens_after == sel.tokens_before == 25


def test_one_token_over_budget_drops_the_least_relevant_that_does_not_fit() -> None:
    sel = select_passages(IDS, BODIES, TOKENS, terms("baggage allowance"), sum(TOKENS) - 1)
    assert 0 in sel.kept and len(sel.kept) < 4 and sel.tokens_after <= 24


def test_the_best_passage_is_kept_even_alone_over_budget() -> None:
    sel = select_passages(IDS, BODIES, TOKENS, terms("baggage allowance"), 4)
    assert sel.kept[0] == 0 and sel.tokens_after >= 10
