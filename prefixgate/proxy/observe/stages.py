"""The body after each pass of the rewrite, for attributing what rewriting saved to the passes.

:func:`stage_bodies` re-runs the rewriter's passes on the request's pass body one at a time, in
pipeline order (:data:`prefixgate.rewriter.pipeline.PASSES`), with the same
:class:`~prefixgate.rewriter.types.Context` the rewrite had (session memory as it was read
before the request, the same clock), so it reproduces the rewrite exactly: the passes are
deterministic functions of the prompt and the context (DESIGN.md, *Invariants*). Each pass runs
through :func:`prefixgate.rewriter.pipeline.run_passes` with a one-pass list, so it gets the
pipeline's own per-pass validation and its "same bytes is not applied" rule.

Output: ``[(pass name, body after it)]`` for every pass of ``PASSES`` in order — a pass that is
switched off or did not change the body's bytes repeats the previous body object; before the
first pass is the client's ``view`` object itself. The last body must render to the bytes of
``sent`` (what went upstream); when it does not (a rewrite function other than the rewriter's, a
pass reading state that moved), the answer is None and nothing is attributed.

Cost: one more run of the passes and one render per pass that applied, in the after-answer
analysis worker (off the event loop, never on the request's path); bounded by a deadline
through ``Context.deadline`` (past it: None). :func:`recorded_bodies` skips the re-run: the
rewrite itself recorded the prompt after each pass
(:attr:`prefixgate.rewriter.types.RewriteResult.stages`), so only the renders remain (issue 25:
the re-run was ~12 % of a rewritten request's CPU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from prefixgate.config.schema import switch_on
from prefixgate.rewriter.pipeline import PASSES, OverBudget, run_passes, wire_bytes
from prefixgate.rewriter.types import Context
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire.ir import Api

log = logging.getLogger("prefixgate.insight")

PASS_NAMES: tuple[str, ...] = tuple(s.name for s in PASSES)
"""Every pass the attribution knows, in pipeline order."""


def stage_bodies(view: dict[str, Any], api: Api, ctx: Context, sent: dict[str, Any],
                 deadline: float) -> list[tuple[str, dict[str, Any]]] | None:
    """``[(pass name, body after that pass)]`` for each of :data:`PASS_NAMES` (module
    docstring), or None when the staged run does not end in ``sent``'s bytes, a pass raises
    outside the pipeline's fail-open, or ``deadline`` (``time.monotonic()`` seconds) passes.
    ``view``: the pass body the rewrite started from; ``api``: its API."""
    if time.monotonic() >= deadline:
        return None
    bounded = replace(ctx, deadline=deadline)
    out: list[tuple[str, dict[str, Any]]] = []
    try:
        prompt = wire.parse(view, api)
        body = view
        for spec in PASSES:
            if spec.fn is not None and switch_on(ctx.settings, spec.switch):
                nxt, edits = run_passes(prompt, bounded, (spec,))
                if any(e.applied for e in edits):
                    rendered = wire.render(nxt)
                    if wire_bytes(rendered) != wire_bytes(body):
                        body = rendered
                prompt = nxt  # IR-only flags (``volatile``) still reach later passes
            out.append((spec.name, body))
        if body is not sent and wire_bytes(body) != wire_bytes(sent):
            return None
    except OverBudget:
        return None
    except Exception:  # never fail the analysis for attribution
        log.exception("staged rewrite for attribution failed")
        return None
    return out


def recorded_bodies(view: dict[str, Any], recorded: Sequence[tuple[str, Any, bool]],
                    sent: dict[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """:func:`stage_bodies` from the stages the rewrite recorded (``(pass name, prompt after
    it, applied)``, :func:`prefixgate.rewriter.pipeline.run_passes`) instead of a re-run: the
    same rule (a pass that applied and changed the bytes gives a new body, any other repeats
    the previous one; the last must be ``sent``'s bytes, else None)."""
    by_name = {name: (prompt, applied) for name, prompt, applied in recorded}
    out: list[tuple[str, dict[str, Any]]] = []
    body = view
    try:
        for spec in PASSES:
            got = by_name.get(spec.name)
            if got is not None and got[1]:
                rendered = wire.render(got[0])
                if wire_bytes(rendered) != wire_bytes(body):
                    body = rendered
            out.append((spec.name, body))
        if body is not sent and wire_bytes(body) != wire_bytes(sent):
            return None
    except Exception:  # never fail the analysis for attribution
        log.exception("recorded stages for attribution failed")
        return None
    return out
