"""``GET /api/savings?range=1h|24h|7d``: the savings document
(:func:`prefixgate.cache.savings.summary.savings_document`)
as JSON, for the dashboard (h/dash) and scripts.

Behind the proxy's keys when keys are configured (:meth:`prefixgate.proxy.http.auth.Guard.admit`, no rate
limit counted): 401 without a valid key, in OpenAI's error shape. An unknown ``range`` is a 400
naming the allowed values. A shared ledger that cannot be read now (PostgreSQL down, or hung past
the reader's deadline) is a 503 with ``retry-after`` (issue 34), not a 500.

Scoped to the caller's tenant (issue 20, Medium 8: any key saw every tenant's traffic and
model names), :func:`scope_of`:

- a key without ``admin``: its tenant's figures only — the rows, rollups and breaks whose
  ``tenant`` is the key's tenant (its ``tenant``, else its ``id``) or one of its sub-tenants
  ``<tenant>/...``, narrowed to its sub-tenant when the request names one
  (``x-prefixgate-tenant`` with ``tenants.header: on``, or ``?tenant=<tenant>/<sub>``); asking
  for any other tenant is a 403 that names none. Rows without a tenant (written before tenants
  existed) are nobody's but the admin's;
- an ``admin: true`` key: every tenant (``?tenant=`` narrows to one);
- no keys configured (only allowed on a loopback address, :func:`prefixgate.proxy.http.auth.needs_keys`):
  nobody is authenticated, so there is no tenant to scope to: every tenant's figures.

The document's ``tenant`` field says the scope (null: all tenants); its ``guard`` list holds the
meaning guard's verdicts (issue 36, :mod:`prefixgate.proxy.pipeline.guard_trial`) of that scope
only: another tenant's trial results are never shown.

The document is computed in a worker thread (SQLite reads and the holdout bootstrap never block
the event loop) and reused for up to :data:`REUSE_S` seconds while
the ledger has no new row or break (a dashboard polling every few seconds costs one computation
per change), so it always equals the ledger as it was a moment ago.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from prefixgate.cache.ledger.store import Ledger, LedgerUnavailable
from prefixgate.cache.savings.summary import RANGES, savings_document
from prefixgate.config.schema import Policy
from prefixgate.proxy.core.errors import (
    Forbidden,
    InvalidRequest,
    LedgerUnreadable,
    ProxyError,
    Unauthorized,
    error_response,
)
from prefixgate.proxy.http.auth import Guard
from prefixgate.proxy.http.tenants import tenant_for

REUSE_S = 10.0


def hourly_prices(policy: Policy) -> dict[str, float | None]:
    """Backend name -> its policy ``usd_per_hour`` (None: not priced by the hour)."""
    return {name: b.usd_per_hour for name, b in policy.backends.items()}


TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64})?$")
"""What ``?tenant=`` may be (a tenant, :mod:`prefixgate.proxy.http.tenants`)."""
MEMO_SCOPES = 256
"""Documents kept per range: one per scope (tenant) asked lately, the oldest forgotten first."""


class _Memo:
    """The last document per (range, scope), with the ledger's (last row id, last break id) it
    saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: OrderedDict[tuple[str, str | None],
                                tuple[float, tuple[Any, ...], dict[str, Any]]] = OrderedDict()

    def get(self, ledger: Ledger, policy: Policy, range_: str,
            tenant: str | None = None) -> dict[str, Any]:
        """The document for ``range_`` scoped to ``tenant`` (None: all; computed now, or
        reused; see module docstring)."""
        mark = tuple(ledger.query("SELECT (SELECT max(id) FROM requests), "
                                  "(SELECT max(id) FROM breaks)")[0])
        now = time.monotonic()
        key = (range_, tenant)
        with self._lock:
            hit = self._docs.get(key)
            if hit is not None and hit[1] == mark and now - hit[0] < REUSE_S:
                return hit[2]
        doc = {**savings_document(ledger, range_, slo=policy.slo, holdout=policy.holdout,
                                  usd_per_hour=hourly_prices(policy), tenant=tenant),
               "tenant": tenant}
        with self._lock:
            self._docs[key] = (now, mark, doc)
            self._docs.move_to_end(key)
            while len(self._docs) > MEMO_SCOPES * len(RANGES):
                self._docs.popitem(last=False)
        return doc


async def scope_of(guard: Guard, policy: Policy, request: Request) -> str | None:
    """The tenant whose figures the caller may see (None: every tenant), per the module
    docstring. Raises Unauthorized (401) without a valid key, Forbidden (403) for a
    ``?tenant=`` outside the caller's own, InvalidHeader (400) for a malformed tenant header."""
    key_id = await guard.admit(request.headers, "openai", limit=False)  # 401 when keys are on
    asked = request.query_params.get("tenant")
    if asked is not None and not TENANT_RE.match(asked):
        raise InvalidRequest("tenant must be a tenant name (1-64 of A-Z a-z 0-9 _ . -, "
                             "optionally /<sub-tenant>)", param="tenant")
    if not key_id:
        return asked or None  # no keys: nobody to scope to (loopback only)
    key = next((k for k in guard.store.keys() if k.id == key_id), None)
    if key is None:  # removed since admit: what it may see is not known
        raise Unauthorized("The proxy key is no longer valid.")
    if key.admin:
        return asked or None
    own = tenant_for(request.headers, key_id, policy, guard)  # the key's, or its sub-tenant
    if asked is None or asked == own:
        return own
    if asked.startswith(own + "/"):
        return asked
    raise Forbidden("This key may see its own tenant's figures only.", param="tenant")


def install(app: FastAPI, ledger: Ledger, policy: Policy, guard: Guard,
            guard_verdicts: Callable[[str | None], list[dict[str, Any]]] | None = None) -> None:
    """Add ``GET /api/savings`` to ``app``. ``guard_verdicts``: the meaning guard's verdicts
    for a scope (``MeaningGuard.snapshot``: that tenant's and its sub-tenants', None: all),
    the document's ``guard`` list (empty without a guard)."""
    memo = _Memo()

    @app.get("/api/savings")
    async def api_savings(request: Request) -> Response:
        try:
            tenant = await scope_of(guard, policy, request)  # 401 / 403 / 400
        except ProxyError as e:
            return error_response(e, "openai")
        range_ = request.query_params.get("range", "1h")
        if range_ not in RANGES:
            return error_response(InvalidRequest(
                f"range must be one of {', '.join(RANGES)}; got {range_[:20]!r}",
                param="range"), "openai")
        try:
            doc = await anyio.to_thread.run_sync(memo.get, ledger, policy, range_, tenant)
        except LedgerUnavailable as e:  # a shared ledger down or hung: 503, try again later
            return error_response(LedgerUnreadable(str(e)), "openai")
        verdicts = guard_verdicts(tenant) if guard_verdicts is not None else []
        return JSONResponse({**doc, "guard": verdicts})  # the caller's tenant's only
