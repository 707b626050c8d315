"""The rewrite step of a request: session identity, the pipeline call, the opt-out, fail-open.

- Session id: :mod:`prefixgate.proxy.pipeline.session_key` (the client's ``x-prefixgate-session``
  header, else a hash of the key, the system text and the first user message with every volatile
  span masked; re-exported here).
- ``x-prefixgate-rewrite: off`` (or ``false`` / ``0``) turns rewriting off for that request;
  so does ``policy.rewrite.enabled: false``.
- The pipeline is :func:`prefixgate.rewriter.pipeline.rewrite_request` (injectable for tests). If it raises,
  the client's body is forwarded unchanged (fail-open) and the failure is logged and reported as
  the edit summary ``rewrite_failed``.
- The upstream bytes: when the body came back unchanged, the client's ORIGINAL bytes are sent
  (lossless by default, no re-serialization of large bodies, B19); otherwise
  :func:`prefixgate.proxy.core.exactjson.dumps` (orjson: key order and every number's text kept).
- Off the event loop, under a budget (issue 8, class 2): :func:`rewrite_off_loop` runs the step
  in a worker thread (at most :data:`REWRITE_THREADS` at once) with ``ctx.deadline`` set from
  ``policy.rewrite.time_budget_ms``. Past the budget the caller stops waiting, the pipeline stops
  before its next pass, and the client's original bytes go upstream with the edit summary
  ``over_budget`` (an ``Edit("pipeline", applied=False)`` says how long it had).
- No garbage-collector tricks per request (issue 34 item 4): a per-request :func:`gc.freeze`
  froze whatever cyclic garbage was pending at that moment out of the collector, and under a
  stream of large bodies it was never unfrozen (+4.2 MB per bridged 1.3 MiB Responses request,
  without bound). A request's objects are freed by reference counting when it ends (no reference
  cycles on the request's path: ``tests/proxy/test_request_garbage.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.to_thread

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.pipeline.session_key import (  # noqa: F401  (re-exported: the pipeline's face)
    SESSION_HEADER,
    SESSION_TEXT_CHARS,
    session_hash,
    session_id_for,
)
from prefixgate.rewriter.types import Api, Context, Edit, RewriteResult

log = logging.getLogger("prefixgate.rewrite")

RewriteFn = Callable[[dict[str, Any], Api, Context], RewriteResult]

OPT_OUT_HEADER = "x-prefixgate-rewrite"
REWRITE_THREADS = 4
"""Rewrites running at once; more wait for a thread, and the wait counts against the budget."""
OVER_BUDGET = "over_budget"
STAGES_MAX_BYTES = 1 << 20
"""Bodies above this keep no stage chain (the IR after each pass) for the after-answer
attribution: their analysis is skipped anyway."""


def default_rewrite_fn() -> RewriteFn | None:
    """The rewriter's pipeline, or None when the rewriter package has no pipeline yet."""
    try:
        from prefixgate.rewriter.pipeline import rewrite_request
    except ImportError:
        log.warning("rewriter.pipeline not available: requests are forwarded unchanged")
        return None
    return rewrite_request


def rewrite_wanted(headers: Mapping[str, str], settings: RewriteSettings) -> bool:
    """False when the policy disables rewriting or the client opted out by header."""
    if headers.get(OPT_OUT_HEADER, "").strip().lower() in ("off", "false", "0", "no"):
        return False
    return settings.enabled


@dataclass
class RewriteOutcome:
    """What the rewrite step produced: ``body`` (dict sent upstream), ``raw`` (its bytes),
    ``summary`` (header / ledger text), ``pruned`` (tokens removed), ``memory`` (merged
    session-memory updates), ``applied`` (whether any pass changed the body)."""

    body: dict[str, Any]
    raw: bytes
    summary: str
    pruned: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    applied: bool = False
    edits: list[Edit] = field(default_factory=list)
    stages: tuple[tuple[str, Any, bool], ...] = ()
    """The rewrite's stage chain (:attr:`prefixgate.rewriter.types.RewriteResult.stages`), read
    by the after-answer attribution; empty when it has none."""


def _dumps(body: dict[str, Any]) -> bytes:
    return exactjson.dumps(body)  # numbers in their original text (issue 8, class 5)


def over_budget(body: dict[str, Any], raw: bytes, budget_ms: int, stage: str = "") -> RewriteOutcome:
    """The outcome of a rewrite that ran out of time: the client's own bytes, and why."""
    where = f" (stopped before {stage})" if stage else ""
    edit = Edit("pipeline", False, "all", f"over the rewrite time budget of {budget_ms} ms"
                f"{where}: sent as the client sent it")
    return RewriteOutcome(body, raw, OVER_BUDGET, edits=[edit])


def run_rewrite(fn: RewriteFn | None, body: dict[str, Any], raw: bytes, api: Api,
                ctx: Context | None) -> RewriteOutcome:
    """Apply ``fn`` (None or ``ctx`` None = rewriting off) and serialize. Never raises."""
    if fn is None or ctx is None:
        return RewriteOutcome(body, raw, "off" if ctx is None else "unavailable")
    from prefixgate.rewriter.pipeline import OverBudget

    try:
        result = fn(body, api, ctx)
    except OverBudget as e:
        return over_budget(body, raw, ctx.settings.time_budget_ms, e.stage)
    except Exception:  # fail-open: the client's request still goes through
        log.exception("rewrite pipeline failed; forwarding the original body")
        return RewriteOutcome(body, raw, "rewrite_failed")
    memory: dict[str, Any] = {}
    for ed in result.edits:
        memory.update(ed.memory)
    summary = result.summary() or "none"
    pruned = sum(ed.tokens_removed for ed in result.edits if ed.applied)
    # a test's rewrite function may record none; a large body's are not kept through the send
    # (its analysis is skipped, pipeline.answer.ANALYZE_MAX_BYTES)
    stages = getattr(result, "stages", ()) if len(raw) <= STAGES_MAX_BYTES else ()
    if result.body is body:
        return RewriteOutcome(body, raw, summary, pruned, memory, False, result.edits, stages)
    return RewriteOutcome(result.body, _dumps(result.body), summary, pruned, memory, True,
                          result.edits, stages)


_limiter: dict[int, anyio.CapacityLimiter] = {}


def _rewrite_limiter() -> anyio.CapacityLimiter:
    """One :class:`anyio.CapacityLimiter` of :data:`REWRITE_THREADS` per event loop."""
    import asyncio

    key = id(asyncio.get_running_loop())
    lim = _limiter.get(key)
    if lim is None:
        _limiter.clear()  # a new loop (tests, restarts): the old limiter belongs to a dead loop
        lim = _limiter[key] = anyio.CapacityLimiter(REWRITE_THREADS)
    return lim


async def rewrite_off_loop(fn: RewriteFn | None, body: dict[str, Any], raw: bytes, api: Api,
                           ctx: Context | None,
                           limiter: anyio.CapacityLimiter | None = None) -> RewriteOutcome:
    """:func:`run_rewrite` in a worker thread under ``ctx.settings.time_budget_ms``.

    Returns the outcome, or :func:`over_budget` (the client's ``raw`` bytes) when the budget
    passes first — waiting for a thread included. The abandoned worker stops before its next
    pass (``ctx.deadline``) and its result is dropped (memory updates too). Never raises.
    ``limiter``: the threads it may wait for (default: the clients', :data:`REWRITE_THREADS`;
    the meaning guard's trials pass their own, so that they never hold a client's).
    """
    if fn is None or ctx is None:
        return run_rewrite(fn, body, raw, api, ctx)
    budget_ms = ctx.settings.time_budget_ms
    bounded = replace(ctx, deadline=time.monotonic() + budget_ms / 1000)
    with anyio.move_on_after(budget_ms / 1000):
        return await anyio.to_thread.run_sync(run_rewrite, fn, body, raw, api, bounded,
                                              abandon_on_cancel=True,
                                              limiter=limiter or _rewrite_limiter())
    log.warning("rewrite over its %d ms budget; forwarding the original body", budget_ms)
    return over_budget(body, raw, budget_ms)
