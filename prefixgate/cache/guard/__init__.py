"""The meaning guard's core: whether a move changes a route's answers more than the backend's own
floor (``sequential``: the group-sequential paired test), what an answer decided (``decisions``),
the verdicts per (route, tenant, move) shared through SharedState (``verdicts``) and the trials'
daily budget (``budget``). Pure but for SharedState; the proxy runs the trials
(``prefixgate/proxy/pipeline/guard_trial.py``).
"""

from prefixgate.cache.guard.budget import BudgetBook, Reservation, TrialBudget
from prefixgate.cache.guard.decisions import changed, decision_of
from prefixgate.cache.guard.sequential import Decision, PairCounts, TestRule, decide
from prefixgate.cache.guard.verdicts import GuardBook, MoveVerdict

MOVES = ("hoist_volatile", "stabilise_passages", "prune_tools", "prune_history", "prune_rag")
"""The moves the guard judges: pass names and their ``RewriteSettings`` switch names."""

__all__ = [
    "MOVES", "BudgetBook", "Decision", "GuardBook", "MoveVerdict", "PairCounts", "Reservation",
    "TestRule", "TrialBudget", "changed", "decide", "decision_of",
]
