"""``GET /api/savings?range=1h|24h|7d``: the savings document
(:func:`prefixgate.cache.savings.savings_document`)
as JSON, for the dashboard (h/dash) and scripts.

Behind the proxy's keys when keys are configured (:meth:`prefixgate.proxy.http.auth.Guard.admit`, no rate
limit counted): 401 without a valid key, in OpenAI's error shape. An unknown ``range`` is a 400
naming the allowed values. The document is computed in a worker thread (SQLite reads and the
holdout bootstrap never block the event loop) and reused for up to :data:`REUSE_S` seconds while
the ledger has no new row or break (a dashboard polling every few seconds costs one computation
per change), so it always equals the ledger as it was a moment ago.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger import Ledger
from prefixgate.cache.savings import RANGES, savings_document
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.errors import InvalidRequest, error_response
from prefixgate.proxy.http.auth import Guard

REUSE_S = 10.0


def hourly_prices(policy: Policy) -> dict[str, float | None]:
    """Backend name -> its policy ``usd_per_hour`` (None: not priced by the hour)."""
    return {name: b.usd_per_hour for name, b in policy.backends.items()}


class _Memo:
    """The last document per range, with the ledger's (last row id, last break id) it saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, tuple[float, tuple[Any, ...], dict[str, Any]]] = {}

    def get(self, ledger: Ledger, policy: Policy, range_: str) -> dict[str, Any]:
        """The document for ``range_`` (computed now, or reused; see module docstring)."""
        mark = tuple(ledger.query("SELECT (SELECT max(id) FROM requests), "
                                  "(SELECT max(id) FROM breaks)")[0])
        now = time.monotonic()
        with self._lock:
            hit = self._docs.get(range_)
            if hit is not None and hit[1] == mark and now - hit[0] < REUSE_S:
                return hit[2]
        doc = savings_document(ledger, range_, slo=policy.slo, holdout=policy.holdout,
                               usd_per_hour=hourly_prices(policy))
        with self._lock:
            self._docs[range_] = (now, mark, doc)
        return doc


def install(app: FastAPI, ledger: Ledger, policy: Policy, guard: Guard) -> None:
    """Add ``GET /api/savings`` to ``app``."""
    memo = _Memo()

    @app.get("/api/savings")
    async def api_savings(request: Request) -> Response:
        await guard.admit(request.headers, "openai", limit=False)  # 401 when keys are on
        range_ = request.query_params.get("range", "1h")
        if range_ not in RANGES:
            return error_response(InvalidRequest(
                f"range must be one of {', '.join(RANGES)}; got {range_[:20]!r}",
                param="range"), "openai")
        doc = await anyio.to_thread.run_sync(memo.get, ledger, policy, range_)
        return JSONResponse(doc)
