"""Tool ranking and keep rules."""

from __future__ import annotations

from prefixgate.rewriter.analysis.tool_rank import KeepRule, ToolInfo, query_terms, rank_tools, siblings


def tool(name: str, desc: str, *params: str) -> ToolInfo:
    return ToolInfo(name, desc, {"type": "object", "properties": {p: {"type": "string"}
                                                                   for p in params}})


CATALOG = [
    tool("cancel_reservation", "Cancel the whole reservation.", "reservation_id"),
    tool("get_reservation_details", "Get the details of a reservation.", "reservation_id"),
    tool("get_user_details", "Get the details of a user.", "user_id"),
    tool("book_reservation", "Book a reservation.", "user_id", "origin", "destination"),
    *[tool(f"repo_tool_{i}", f"Do repository thing {i} on GitHub.", "owner", "repo")
      for i in range(30)],
]


def test_ranks_by_name_description_and_parameters() -> None:
    ranked = rank_tools(CATALOG, query_terms(["Please cancel my reservation ABC"]))
    assert ranked[0][0] == "cancel_reservation"
    assert ranked[0][1] > ranked[-1][1] == 0.0


def test_ranking_is_deterministic_with_name_tiebreak() -> None:
    a = rank_tools(CATALOG, query_terms(["nothing matches zzz"]))
    b = rank_tools(list(reversed(CATALOG)), query_terms(["nothing matches zzz"]))
    assert a == b and [n for n, _ in a] == sorted(n for n, _ in a)


def test_siblings_follow_specific_arguments_only() -> None:
    assert siblings(CATALOG, ["cancel_reservation"]) == ["get_reservation_details"]
    # owner/repo are taken by 30 of 34 tools: not specific, so they link nothing
    assert siblings(CATALOG, ["repo_tool_0"]) == []


def test_keep_rule_floor_ratio_and_token_share() -> None:
    ranked = [("a", 9.0), ("b", 5.0), ("c", 1.0), ("d", 0.0), ("e", 0.0)]
    assert KeepRule(min_keep=1, score_ratio=0.5, max_keep=0, token_share=0).select(ranked) \
        == ["a", "b"]
    assert KeepRule(min_keep=3, score_ratio=0.9, max_keep=0, token_share=0).select(ranked) \
        == ["a", "b", "c"]
    tokens = {"a": 10, "b": 10, "c": 500, "d": 20, "e": 10}
    # 20 % of 550 tokens = 110: c does not fit, the smaller d and e still do
    assert KeepRule(min_keep=2, score_ratio=1.0, max_keep=0, token_share=0.2).select(
        ranked, tokens) == ["a", "b", "d", "e"]
