"""``GET /api/savings?range=1h|24h|7d``: the savings document (:func:`cache.savings.savings_document`)
as JSON, for the dashboard (h/dash) and scripts.

Behind the proxy's keys when keys are configured (:meth:`proxy.auth.Guard.admit`, no rate
limit counted): 401 without a valid key, in OpenAI's error shape. An unknown ``range`` is a 400
naming the allowed values. The document is computed in a worker thread (SQLite reads and the
holdout bootstrap never block the event loop).
"""

from __future__ import annotations

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from cache.ledger import Ledger
from cache.savings import RANGES, savings_document
from config.schema import Policy
from proxy.auth import Guard
from proxy.errors import InvalidRequest, error_response


def install(app: FastAPI, ledger: Ledger, policy: Policy, guard: Guard) -> None:
    """Add ``GET /api/savings`` to ``app``."""

    @app.get("/api/savings")
    async def api_savings(request: Request) -> Response:
        await guard.admit(request.headers, "openai", limit=False)  # 401 when keys are on
        range_ = request.query_params.get("range", "1h")
        if range_ not in RANGES:
            return error_response(InvalidRequest(
                f"range must be one of {', '.join(RANGES)}; got {range_[:20]!r}",
                param="range"), "openai")
        doc = await anyio.to_thread.run_sync(
            lambda: savings_document(ledger, range_, slo=policy.slo, holdout=policy.holdout))
        return JSONResponse(doc)
