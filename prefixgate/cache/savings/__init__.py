"""The arithmetic users read: the ``/api/savings`` document (``summary``), the measured
counterfactual, time saved, the holdout, stand-back, cost, the report, P/D decision counts and
cache breaks (with ``break_spans``, which masks volatile spans to blame a break). Attribution
lives with the ledger rows it splits (``cache/ledger/attribution.py``); the block reader of wire
bodies with the cache models (``cache/provider_models/prefix_blocks.py``).
"""

__all__ = [
    "break_spans", "breaks", "cost", "counterfactual", "holdout_stats", "pd_decisions", "report",
    "stand_back", "summary", "time_saved",
]
