"""Stand back where rewriting does not pay (issue 19): per route and tenant, a verdict from recent
requests, and the passes that cost tokens switched off while it holds.

A pass that adds tokens (``hoist_volatile``'s note, placeholders) pays only through the reuse it
buys; on a backend whose cache rules do not reward it, or a traffic whose prefixes are shared
anyway, the rewritten arm can cache no more than the client's own bodies would — the project's
own tau-bench dashboard saved -1,024 tokens while the holdout cached more. A pass that cannot
pay should do nothing (DESIGN.md, *Invariants*: "a pass runs only when it pays").

:class:`RouteJudge` keeps, per route **and tenant**, the last :attr:`window` finished requests of
each arm (ledger-row fields only: no prompt text) and decides, in this order:

1. **Holdout** (measured, both arms): when each arm holds at least ``min_requests`` requests,
   the rewritten arm against the held-out one (:func:`prefixgate.cache.savings.holdout_stats.compare`:
   cached share, prompt cost, TTFT p50 / p95, Bonferroni-corrected bootstrap intervals).
   ``rewriting helps`` keeps the passes; ``no difference`` or ``rewriting hurts`` stands back;
   ``inconclusive`` (mixed) falls through.
2. **Counterfactual** (measured where the backend saw the client's prompt, else modelled on the
   real cache, :mod:`prefixgate.proxy.observe.insight`): over at least ``min_requests``
   rewritten requests with a counterfactual, the tokens saved — ``(cached - cf_cached) + removed
   - added`` per request, the ledger's own figure (:mod:`prefixgate.cache.ledger.attribution`). A sum
   ``<= 0`` (no better than the client's bodies) stands back.
3. Otherwise (too few requests): the passes keep running.

Standing back switches off, for ``off_s`` seconds, the passes that cost tokens: those that added
tokens (``pass_tokens`` ``added > 0``) in the window's rewritten requests. Passes that add
nothing keep running (they cannot cost tokens). When the time is up, the route's windows are
emptied and the passes run again: the next verdict is taken on fresh requests, so a route whose
traffic changed gets its rewriting back after ``min_requests`` requests at most. Requests sent
while standing back (``stood_back`` set) never count toward a verdict.

Per tenant (issue 34 item 6): one tenant's requests judge that tenant's rewriting only. A
route-wide verdict let one tenant steer everyone: 90 requests with unique hoisted ids switched
``hoist_volatile`` off for the route, and another tenant's clock stayed in the cached prefix
for 900 s. Each tenant has its own prefix cache anyway (``cache_salt``, per-tenant keys,
:mod:`prefixgate.proxy.http.tenants`), so whether a move pays is a property of that tenant's
traffic; a tenant with too few requests of its own keeps its passes. Requests without a tenant
(a single-tenant proxy) are one tenant, ``""``: the route-wide verdict as before.

Bounded: at most ``window`` rows of a few numbers per arm per (route, tenant), at most
:data:`MAX_JUDGED` (route, tenant) pairs (the least recently used forgotten: it starts over with
its passes on); a verdict is recomputed every :data:`EVERY` new rows of a pair (the bootstrap of
two arms of ``window`` rows, ~2 ms), never per request. No I/O, no clock of its own (``now_s``
is passed in).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixgate.cache.ledger.attribution import parse_pass_tokens, reuse_of, span_reused_of
from prefixgate.cache.savings.holdout_stats import HELPS, HURTS, NO_DIFF, compare

WINDOW = 64
MIN_REQUESTS = 20
OFF_S = 900.0
EVERY = 8
"""New rows of a (route, tenant) between two verdicts."""
MAX_JUDGED = 4096
"""(route, tenant) pairs judged at once; the least recently used is forgotten past it."""
FIELDS = ("holdout", "prompt_tokens", "cached_tokens", "cf_cached_tokens", "input_usd",
          "ttft_ms", "tokens_pruned", "pass_tokens", "span_reused_tokens")


@dataclass(frozen=True)
class Verdict:
    """``stand_back``: switch ``passes`` off (pass names, pipeline switches); ``basis``:
    ``holdout`` | ``counterfactual`` | ``""`` (not enough requests); ``reason``: one line for
    the Edit, the header and the report; ``until``: unix seconds the stand-back ends."""

    stand_back: bool
    passes: tuple[str, ...] = ()
    basis: str = ""
    reason: str = ""
    until: float = 0.0

    def summary(self) -> str:
        """``<passes>: <reason>``: the ledger's ``stood_back`` column (ASCII, no prompt text)."""
        return f"{','.join(self.passes)}: {self.reason}".encode("ascii", "replace").decode()


KEEP = Verdict(False)


def saved_tokens(row: Mapping[str, Any]) -> int:
    """One row's tokens saved by rewriting: ``(cached - cf_cached) + removed - added`` less the
    engine's span reuse (issue 33: the engine saves those whether the passes run or not, so
    they never keep a pass on)."""
    added = sum(f["added"] for f in parse_pass_tokens(row.get("pass_tokens")).values())
    return reuse_of(row) - span_reused_of(row) + int(row.get("tokens_pruned") or 0) - added


def costly_passes(rows: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Passes that added tokens in ``rows``, sorted."""
    names = {n for r in rows for n, f in parse_pass_tokens(r.get("pass_tokens")).items()
             if f["added"] > 0}
    return tuple(sorted(names))


def judge(rewritten: list[Mapping[str, Any]], holdout: list[Mapping[str, Any]],
          min_requests: int = MIN_REQUESTS, seed: int = 0) -> tuple[bool, str, str]:
    """(stand back?, basis, reason) from one route's recent requests (module docstring)."""
    if len(rewritten) >= min_requests and len(holdout) >= min_requests:
        cmp = compare(rewritten, holdout, seed)
        v, n = cmp["verdict"], f"{len(rewritten)}/{len(holdout)} requests"
        if v == HELPS:
            return False, "holdout", f"holdout: {v} ({cmp['reason']}, {n})"
        if v in (NO_DIFF, HURTS):
            return True, "holdout", f"holdout: {v} ({cmp['reason']}, {n})"
    with_cf = [r for r in rewritten if r.get("cf_cached_tokens") is not None]
    if len(with_cf) >= min_requests:
        saved = sum(saved_tokens(r) for r in with_cf)
        why = f"counterfactual: saved {saved:,} tokens over {len(with_cf)} rewritten requests"
        return saved <= 0, "counterfactual", why
    return False, "", ""


@dataclass
class _Route:
    rewritten: deque[dict[str, Any]]
    holdout: deque[dict[str, Any]]
    fresh: int = 0
    verdict: Verdict = KEEP


@dataclass
class RouteJudge:
    """Per-(route, tenant) verdicts (module docstring); thread-safe. ``enabled``: False = never
    stand back; ``seed``: the holdout bootstrap's; ``every``: new rows of a pair between two
    verdicts; ``max_judged``: pairs kept (least recently used forgotten)."""

    enabled: bool = True
    window: int = WINDOW
    min_requests: int = MIN_REQUESTS
    off_s: float = OFF_S
    seed: int = 0
    every: int = EVERY
    max_judged: int = MAX_JUDGED
    _routes: OrderedDict[tuple[str, str], _Route] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _route(self, route: str, tenant: str = "") -> _Route:
        key = (route, tenant)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = _Route(deque(maxlen=self.window), deque(maxlen=self.window))
            while len(self._routes) > self.max_judged:
                self._routes.popitem(last=False)
        else:
            self._routes.move_to_end(key)
        return r

    def observe(self, row: Mapping[str, Any]) -> None:
        """Count one finished request (a ledger row's fields). Failed requests, requests
        without usage, bodies never rewritten and requests sent standing back are ignored."""
        if not self.enabled or (row.get("status") or "ok") != "ok" or row.get("stood_back"):
            return
        if row.get("prompt_tokens") is None or not (row.get("rewrite") or row.get("holdout")):
            return
        rec = {k: row.get(k) for k in FIELDS}
        with self._lock:
            r = self._route(str(row.get("route") or ""), str(row.get("tenant") or ""))
            (r.holdout if row.get("holdout") else r.rewritten).append(rec)
            r.fresh += 1

    def verdict(self, route: str, now_s: float, tenant: str = "") -> Verdict:
        """``tenant``'s verdict on ``route`` now, from that tenant's requests only: a standing
        stand-back until it ends; else, every ``every`` new rows, a new one (:func:`judge`).
        Never raises."""
        if not self.enabled:
            return KEEP
        with self._lock:
            r = self._route(route, tenant)
            if r.verdict.stand_back:
                if now_s < r.verdict.until:
                    return r.verdict
                r.rewritten.clear()  # time is up: the passes run again, on fresh evidence
                r.holdout.clear()
                r.verdict, r.fresh = KEEP, 0
                return KEEP
            if r.fresh < self.every:
                return KEEP
            r.fresh = 0
            rewritten, holdout = list(r.rewritten), list(r.holdout)
        try:
            back, basis, why = judge(rewritten, holdout, self.min_requests, self.seed)
        except Exception:  # a verdict must never fail a request
            return KEEP
        passes = costly_passes(rewritten) if back else ()
        if not passes:
            return KEEP
        v = Verdict(True, passes, basis, f"rewritten arm no better than unrewritten ({why})",
                    now_s + self.off_s)
        with self._lock:
            self._route(route, tenant).verdict = v
        return v
