"""What the passes share: volatile-span detectors, learned volatility, passages, tool ranking,
BM25, token counting, the stable region, note placement, TTL choice and whether a pass pays.
"""

__all__ = [
    "bm25", "learned_volatility", "note_placement", "order_meaning", "passage_forms", "passages",
    "pays", "stable", "tokens", "tool_rank", "ttl_choice", "volatile_spans",
]
