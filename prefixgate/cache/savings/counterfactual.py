"""The counterfactual of a ledger row that can be measured rather than modelled.

A body that went upstream exactly as the client sent it is its own counterfactual: what the
client's body would have cached is what it did cache (DESIGN.md, *Savings, measured honestly*:
measured wins over modelled) — on a prefix cache. The counterfactual is the client's body on a
prefix cache, as every cache model computes it; where our engine reused KV across a changed span
(issue 33), those tokens (its own count, ``span_reused_tokens``) are not what a prefix cache
would have given, so :func:`prefix_cached` takes them out: they are the engine's saving,
:data:`prefixgate.cache.ledger.attribution.SPAN_REUSE`.
"""

from __future__ import annotations

from prefixgate.cache.ledger.rollup import SENT_AS_IS
from prefixgate.cache.ledger.store import LedgerRow

__all__ = ["SENT_AS_IS", "measured_counterfactual", "prefix_cached"]


def prefix_cached(row: LedgerRow) -> int | None:
    """``cached_tokens`` less the engine's ``span_reused_tokens`` (clamped to 0): what the
    request got from a prefix cache alone; None when no cached tokens were reported."""
    if row.cached_tokens is None:
        return None
    return max(0, row.cached_tokens - (row.span_reused_tokens or 0))


def measured_counterfactual(row: LedgerRow) -> None:
    """Fill ``row``'s counterfactual from its own usage when its body went upstream unchanged (edits
    ``""`` — never rewritten, as on the side endpoints — or one of
    :data:`prefixgate.cache.ledger.rollup.SENT_AS_IS`: no pass applied, rewriting off, over its time
    budget, or failed open) and nothing set one: the client's own body is what was sent, so what
    it would have cached is what it did cache from the prefix (:func:`prefix_cached`). Its price
    is ``input_usd``, or None where the engine reused a span (this module prices nothing: the
    record step, which knows the backend's rate, prices such rows; an unpriced counterfactual
    claims no USD).
    Rows without reported cached tokens, or with an edited body, keep none."""
    if (row.cf_cached_tokens is not None or row.cached_tokens is None
            or (row.edits and row.edits not in SENT_AS_IS)):
        return
    row.cf_cached_tokens = prefix_cached(row)
    row.cf_input_usd = row.input_usd if row.cf_cached_tokens == row.cached_tokens else None
    row.cf_source = "holdout" if row.holdout else "measured"
