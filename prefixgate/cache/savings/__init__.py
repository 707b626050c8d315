"""The arithmetic users read: the ``/api/savings`` document (``summary``), attribution, the
counterfactual, time saved, the holdout, stand-back, cost, the report, cache breaks (with
``break_spans``, which masks volatile spans to blame a break) and the block reader of wire bodies.
"""

__all__ = [
    "break_spans", "breaks", "cost", "counterfactual", "holdout_stats", "pd_decisions", "report",
    "stand_back", "summary", "time_saved",
]
