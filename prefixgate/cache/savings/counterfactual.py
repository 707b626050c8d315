"""The counterfactual of a ledger row that can be measured rather than modelled.

A body that went upstream exactly as the client sent it is its own counterfactual: what the
client's body would have cached is what it did cache (DESIGN.md, *Savings, measured honestly*:
measured wins over modelled).
"""

from __future__ import annotations

from prefixgate.cache.ledger.rollup import SENT_AS_IS
from prefixgate.cache.ledger.store import LedgerRow

__all__ = ["SENT_AS_IS", "measured_counterfactual"]


def measured_counterfactual(row: LedgerRow) -> None:
    """Fill ``row``'s counterfactual from its own usage when its body went upstream unchanged (edits
    ``""`` — never rewritten, as on the side endpoints — or one of
    :data:`prefixgate.cache.ledger.rollup.SENT_AS_IS`: no pass applied, rewriting off, over its time
    budget, or failed open) and nothing set one: the client's own body is what was sent, so what it
    would have cached is what it did cache. Rows without reported cached tokens, or with an edited
    body, keep none."""
    if (row.cf_cached_tokens is not None or row.cached_tokens is None
            or (row.edits and row.edits not in SENT_AS_IS)):
        return
    row.cf_cached_tokens, row.cf_input_usd = row.cached_tokens, row.input_usd
    row.cf_source = "holdout" if row.holdout else "measured"
