"""A request the backend never answered saved nothing (:mod:`prefixgate.cache.ledger.attribution`).

The proxy writes a row's ``tokens_pruned`` and ``pass_tokens`` when it rewrites, before the
request goes out; a request that then fails upstream (a 429, a 500), or is refused or cut
before any usage comes, keeps them. Nothing was billed, so nothing was saved: pruning that
never reached a bill is no saving, and a client's retry of the same request is not a second
one. Every savings figure — ``/api/savings`` totals and ``by_technique``, the report's saved
line and groups — is the same with such rows in the ledger as without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.attribution import by_technique
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.savings import report
from prefixgate.cache.savings.summary import savings_document

T0 = 1_800_000_000.0
PRUNE = '{"hoist_volatile":{"added":30,"removed":0,"reusable":0},' \
        '"prune_rag":{"added":0,"removed":700,"reusable":0}}'


def _answered(ts: float) -> dict[str, Any]:
    return {"ts": ts, "route": "m*", "model": "gpt-4o", "backend": "up", "prompt_tokens": 1000,
            "cached_tokens": 400, "output_tokens": 20, "cf_cached_tokens": 100,
            "input_usd": 0.002, "cf_input_usd": 0.0024, "ttft_ms": 50.0, "tpot_ms": 10.0,
            "edits": "hoist_volatile;prune_rag-700", "tokens_pruned": 700, "pass_tokens": PRUNE}


def _unanswered(ts: float, status: str) -> dict[str, Any]:
    """The same request, failed before usage: its pruning figures as the rewrite left them."""
    return {"ts": ts, "route": "m*", "model": "gpt-4o", "backend": "up", "status": status,
            "edits": "hoist_volatile;prune_rag-700", "tokens_pruned": 700, "pass_tokens": PRUNE}


def _ledger(path: Path, rows: list[dict[str, Any]]) -> Ledger:
    led = Ledger(path)
    for r in rows:
        led.write(LedgerRow(**r))
    return led


SAVED = ("saved_tokens", "saved_usd", "pruned_tokens", "added_tokens", "cf_cached_tokens")


@pytest.mark.parametrize("status", ["upstream_error", "client_disconnect", "UpstreamUnavailable"])
def test_failed_requests_add_nothing_to_the_savings(tmp_path: Path, status: str) -> None:
    good = [_answered(T0 + 5), _answered(T0 + 65)]
    failed = [_unanswered(T0 + 2, status), _unanswered(T0 + 3, status),
              _unanswered(T0 + 70, status)]  # a client retrying the same request
    with_failed = _ledger(tmp_path / "a.sqlite", good + failed)
    only_good = _ledger(tmp_path / "b.sqlite", good)
    a = savings_document(with_failed, "1h", now=T0 + 300)
    b = savings_document(only_good, "1h", now=T0 + 300)
    assert {k: a["totals"][k] for k in SAVED} == {k: b["totals"][k] for k in SAVED}
    assert a["totals"]["saved_tokens"] == 2 * ((400 - 100) + 700 - 30)
    assert a["by_technique"] == b["by_technique"]
    assert a["series"]["tokens"]["pruned"] == b["series"]["tokens"]["pruned"]
    assert a["totals"]["requests"] == 5 and a["totals"]["no_usage_reported"] == 3
    rows_a = with_failed.rows()
    rows_b = only_good.rows()
    for key in ("saved_tokens", "added_tokens"):
        assert report.token_savings(rows_a)[key] == report.token_savings(rows_b)[key]
    assert [t.to_dict() for t in by_technique(rows_a)] == \
        [t.to_dict() for t in by_technique(rows_b)]
    with_failed.close()
    only_good.close()


def test_a_failed_row_folds_to_no_pruning_and_no_techniques() -> None:
    d = rollup.fold(_unanswered(T0, "upstream_error"))
    assert d["pruned_tokens"] == 0 and "tech" not in d and "added_tokens" not in d
    assert rollup.fold(_answered(T0))["pruned_tokens"] == 700
