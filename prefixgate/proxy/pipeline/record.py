"""The record step: one ledger row per request, filled from the answer (issue 9).

- :func:`finish` fills a row from the answer's usage and timing, merges session memory, runs the
  after-answer analysis and records the row, exactly once, whatever fails in between. Prices:
  the dated table's (:func:`prefixgate.proxy.observe.insight.input_cost_usd`), or the backend's
  own ``price_per_mtok`` where the table has none for the model (or only the self-hosted 0):
  then ``input_usd`` and ``cf_input_usd`` both come from it (issue 19, item 8).
- :func:`pass_tokens_json`: the applied Edits' token counts and each pass's credit as
  ``{pass: {"reusable", "removed", "added"}}`` (token counts only, never text), the ledger's
  ``pass_tokens`` column, read by :mod:`prefixgate.cache.ledger.attribution`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.savings.counterfactual import SENT_AS_IS, prefix_cached
from prefixgate.cache.savings.miss_causes import predicted_cause
from prefixgate.config.prices import backend_input_usd, backend_priced
from prefixgate.config.schema import switch_on
from prefixgate.proxy.core import heap
from prefixgate.proxy.core.bounded import clip_strings
from prefixgate.proxy.core.engine_timings import apply_reported_timings, with_body_times
from prefixgate.proxy.core.usage import Usage
from prefixgate.proxy.observe.insight import Analysis, input_cost_usd
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.rewriter.passes.breakpoints import DIAGNOSTICS_MEMORY
from prefixgate.rewriter.types import Edit

log = logging.getLogger("prefixgate.proxy")

def pass_tokens_json(edits: Iterable[Edit], credits: Mapping[str, int] | None = None) -> str:
    """``{pass: {"reusable", "removed", "added"}}``: ``removed`` / ``added`` summed over the
    applied ``edits`` (a pass may emit several), ``reusable`` the pass's credit by the stage
    rule (``credits``, :mod:`prefixgate.proxy.observe.insight`; 0 without one — a pass's own
    ``Edit.tokens_reusable`` is its estimate of what it protects, not what it made reusable
    that would not have been otherwise, so it is never credited). Passes with all three 0 are
    left out; "" when none is left."""
    out: dict[str, dict[str, int]] = {}
    for e in edits:
        if not e.applied:
            continue
        f = out.setdefault(e.pass_name, {"reusable": 0, "removed": 0, "added": 0})
        f["removed"] += e.tokens_removed
        f["added"] += e.tokens_added
    for name, tokens in (credits or {}).items():
        out.setdefault(name, {"reusable": 0, "removed": 0, "added": 0})["reusable"] = tokens
    out = {k: v for k, v in out.items() if any(v.values())}
    return json.dumps(out, separators=(",", ":"), sort_keys=True) if out else ""


def _own_price(ex: Exchange) -> tuple[float, float] | None:
    """``(price_per_mtok, cached_price_per_mtok)`` of the request's backend when it sets one and
    the dated table does not price the model (or prices it as self-hosted, 0); else None (the
    table's price, or unpriced)."""
    backend = ex.target.backend if ex.target is not None else None
    if backend is None or backend.price_per_mtok is None or not backend_priced(ex.row.model):
        return None
    return backend.price_per_mtok, backend.cached_price_per_mtok
def measured_as_sent(row: LedgerRow, credits: Mapping[str, int] | None) -> None:
    """The counterfactual of a row whose backend saw the client's own prompt (sent as is, or
    rewritten to the same tokens / cache blocks): what it did cache from the prefix (less the
    engine's span reuse, issue 33: :func:`prefixgate.cache.savings.counterfactual.prefix_cached`),
    less what earlier rewriting left in the cache (``credits``' sum,
    :mod:`prefixgate.proxy.observe.insight`; 0 when no pass has changed bytes there: then it is
    measured, and the model's estimate would only add its error — template tokens, tokenizer)."""
    cached = prefix_cached(row)
    assert cached is not None
    after = sum((credits or {}).values())
    if after == 0:
        row.cf_cached_tokens = cached
        row.cf_input_usd = row.input_usd if cached == row.cached_tokens else input_cost_usd(
            row.model, row.prompt_tokens, cached, row.cache_write_tokens)
        row.cf_source = "holdout" if row.holdout else "measured"
        return
    top = row.prompt_tokens if row.prompt_tokens is not None else cached - after
    row.cf_cached_tokens = min(max(0, cached - after), max(0, top))
    row.cf_input_usd = input_cost_usd(row.model, row.prompt_tokens, row.cf_cached_tokens,
                                      row.cache_write_tokens)
    row.cf_source = "holdout" if row.holdout else "modelled"


def remember_answer_id(ex: Exchange, answer_id: object) -> None:
    """On a route that asks for cache diagnostics, the answer's id goes into the session's
    memory for the next request's ``previous_message_id`` (merged with the rewrite's)."""
    if ex.ctx is None or not ex.ctx.settings.cache_diagnostics or ex.rw is None:
        return
    if isinstance(answer_id, str) and 0 < len(answer_id) <= 200:
        ex.rw.memory[DIAGNOSTICS_MEMORY] = {"previous_id": answer_id}


def bridged(brk: dict[str, object], row: LedgerRow) -> dict[str, object]:
    """The break record with ``bridged_tokens``: the engine's span-reused tokens of the request
    that broke the prefix (issue 33; :mod:`prefixgate.cache.savings.breaks` shows such a break
    as bridged by the engine, not as a loss); unchanged when the engine reused none."""
    if not row.span_reused_tokens:
        return brk
    return {**brk, "bridged_tokens": row.span_reused_tokens}


async def merge_memory(state: ProxyState, ex: Exchange) -> None:
    """Merge the rewrite's session-memory updates into the session's memory (what the next
    turn's passes read); a failure is logged, never raised."""
    if ex.rw is None or not ex.rw.memory:
        return
    try:
        await state.sessions.amerge(ex.session_id, ex.rw.memory)
    except Exception:
        log.exception("session memory merge failed")


async def finish(state: ProxyState, ex: Exchange, usage: Usage, status: str, http_status: int,
                 analyze: Callable[[], Awaitable[Analysis]] | None = None,
                 memory: bool = False,
                 gate: Callable[[], Awaitable[None]] | None = None) -> None:
    """Fill the row's usage and timing, merge the rewrite's session memory (``memory``), run
    the break / counterfactual analysis (``analyze``), await ``gate`` (rows kept in answer
    order, :class:`prefixgate.proxy.pipeline.after_answer.RecordOrder`), record. Whatever
    fails in between, the row is written (with what is known)."""
    row, timing = ex.row, ex.timing
    try:
        row.prompt_tokens, row.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        row.cache_write_tokens = usage.cache_write_tokens
        row.reported_miss = usage.miss_reason or ""  # the provider's own (core.diagnostics)
        row.reported_missed_tokens = usage.missed_tokens
        row.reported_reusable_tokens = usage.reusable_tokens
        row.span_reused_tokens = usage.span_reused_tokens
        deltas = ex.watcher.deltas if ex.watcher is not None else 0
        row.output_tokens = usage.output_tokens if usage.output_tokens is not None else (
            deltas if row.stream and deltas else None)
        row.ttft_ms = timing.ttft_ms()
        ex.obs.response_model = ex.obs.response_model or getattr(ex.watcher, "model", None)
        row.tpot_ms = timing.tpot_ms(row.output_tokens)
        row.total_ms = timing.total_ms()
        apply_reported_timings(row, with_body_times(ex.reported, usage.prefill_ms, usage.decode_ms))
        if memory:
            await merge_memory(state, ex)
        own = _own_price(ex)
        row.input_usd = input_cost_usd(row.model, row.prompt_tokens, row.cached_tokens,
                                       row.cache_write_tokens) if own is None else (
            backend_input_usd(*own, row.prompt_tokens, row.cached_tokens))
        if analyze is not None:  # tokenize + CPU work off the loop, bounded (observe.insight)
            a = await analyze()
            row.cf_cached_tokens, row.cf_input_usd = a.cf_cached_tokens, a.cf_input_usd
            row.cf_source = "holdout" if row.holdout else a.cf_source
            same = row.edits in SENT_AS_IS or a.same_as_sent
            if same and row.cached_tokens is not None:
                measured_as_sent(row, a.credits)
            if own is not None and row.cf_cached_tokens is not None:  # the same prices, both sides
                row.cf_input_usd = backend_input_usd(*own, row.prompt_tokens, row.cf_cached_tokens)
            if ex.rw is not None:  # the passes' credits; their tokens only where they changed some
                row.pass_tokens = pass_tokens_json(() if same else ex.rw.edits, a.credits)
                if same:
                    row.tokens_pruned = 0
            if row.reported_miss:  # predicted vs reported, one vocabulary
                row.predicted_miss = predicted_cause(a.brk)
            if a.brk is not None:
                brk = {**a.brk, "reported": row.reported_miss} if row.reported_miss else a.brk
                ex.obs.break_kind = a.brk.get("kind")
                try:
                    rw = ex.resolved_settings  # what the top break's fix depends on: the
                    # request's own switches (a guarded move resolved, guard_moves)
                    hoist_on = bool(row.rewrite and rw is not None and rw.enabled
                                    and switch_on(rw, "hoist_volatile"))
                    where = {"route": row.route, "backend": row.backend, "model": row.model,
                             "holdout": row.holdout, "hoist_on": hoist_on}
                    state.ledger.write_break(row.session, bridged(clip_strings({**brk, **where}), row),
                                             row.tenant)  # clipped: model names are the client's
                except Exception:
                    log.exception("break record write failed")
    except Exception:
        log.exception("after-answer accounting failed; the row keeps what is known")
    finally:
        if gate is not None:
            try:
                await gate()
            except Exception:
                log.exception("waiting for the previous row failed")
        ex.record(state, status, http_status)
        if state.meaning_guard is not None and status == "ok":  # a background trial, maybe
            state.meaning_guard.after(state, ex)
        heap.trim_soon(len(ex.raw))  # a large body's freed buffers back to the system
