"""What the meaning guard's trials cost, on its own line (issue 36).

A trial send (:mod:`prefixgate.proxy.pipeline.guard_trial`) is written to the ledger with
``trial`` = the move it judged. It is never a client's answer and never a saving: the rollups
leave it out and every savings reader filters it (:data:`prefixgate.cache.ledger.store.CLIENT_ROWS`).
Its cost is summed here instead: requests, tokens (prompt + output, as the backend reported
them) and USD — the row's ``input_usd`` plus its output tokens at the dated price table's
output price (:func:`prefixgate.config.prices.price_for`; 0 for a model the table does not
price, e.g. a self-hosted engine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.prices import price_for

TRIAL_COLUMNS = ("trial", "route", "model", "prompt_tokens", "output_tokens", "input_usd")


def trial_rows(ledger: Ledger, since_ts: float = 0.0,
               tenant: str | None = None) -> list[dict[str, Any]]:
    """The trial sends' rows with ``ts >= since_ts`` (:data:`TRIAL_COLUMNS` only; ``tenant``'s
    and its sub-tenants' when given)."""
    where, params = rollup.tenant_filter(tenant)
    got = ledger.query(f"SELECT {', '.join(TRIAL_COLUMNS)} FROM requests WHERE ts >= ? "
                       f"AND COALESCE(trial, '') != ''{where} ORDER BY id", (since_ts, *params))
    return [dict(zip(TRIAL_COLUMNS, r)) for r in got]


def row_usd(row: Mapping[str, Any]) -> float:
    """USD of one trial send: its ``input_usd`` (0 when unpriced) plus its output tokens at the
    table's output price for its model (0 when the table has none)."""
    price = price_for(str(row.get("model") or ""))
    out = (row.get("output_tokens") or 0) * (price.output if price is not None else 0.0) / 1e6
    return float(row.get("input_usd") or 0.0) + out


def trial_spend(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"requests", "tokens", "usd", "by_route": {route: {"requests", "tokens", "usd"}}}``
    summed over trial rows (``tokens``: prompt + output tokens reported)."""
    total: dict[str, Any] = {"requests": 0, "tokens": 0, "usd": 0.0, "by_route": {}}
    for r in rows:
        tokens = int(r.get("prompt_tokens") or 0) + int(r.get("output_tokens") or 0)
        usd = row_usd(r)
        for acc in (total, total["by_route"].setdefault(str(r.get("route") or ""),
                                                        {"requests": 0, "tokens": 0, "usd": 0.0})):
            acc["requests"] += 1
            acc["tokens"] += tokens
            acc["usd"] += usd
    return total


def trial_line(spend: Mapping[str, Any]) -> str:
    """``meaning-guard trials: N requests, T tokens, $X`` (the report's own cost line)."""
    return (f"meaning-guard trials: {spend['requests']} requests, {spend['tokens']} tokens, "
            f"${spend['usd']:.4f}")
