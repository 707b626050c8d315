"""The rewrite pipeline: :func:`rewrite_request`, the public entry point of ``rewriter``.

Order (DESIGN.md, "A request's path" step 4)::

    canonicalize_tools -> hoist_volatile -> stabilise_passages -> prune_tools -> prune_rag
    -> prune_history -> place_breakpoints

Each pass is a module exposing ``run(prompt: Prompt, ctx: Context) -> (Prompt, list[Edit])``,
listed in :data:`PASSES` (plain imports) with the ``RewriteSettings`` switch that turns it on.
Fail-open, per pass: if a pass raises, or its output breaks an API rule its input did not break
(:func:`prefixgate.rewriter.wire.validate.introduced`), or moves, merges, edits or drops a
mid-conversation form (:func:`prefixgate.rewriter.wire.forms.forms`: a system message inside the
conversation, a tool-change or unknown block), its output is dropped, its memory updates too, and
an ``Edit(applied=False)`` says why; the next pass runs on its input.
When nothing applied, the caller's body object is returned as is (byte-identical forwarding).

Honest edits, by construction: a pass whose output renders to its input's bytes (key order
included, :func:`same_wire`) has its applied Edits turned into ``applied=False`` ("left the
prompt unchanged"; its memory updates are kept), and when the rendered body's bytes equal the
client's body's, every Edit is, and the client's body object is returned. So
``edits`` / ``x-prefixgate-edits`` name a pass only when the body it produced differs.

Time budget: with ``ctx.deadline`` set, :class:`OverBudget` is raised before a pass (or the
render) that would start past it; the caller sends the client's request unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from prefixgate.config.schema import switch_on
from prefixgate.rewriter.analysis.stable import marked_region, stable_prefix_hash
from prefixgate.rewriter.passes import (
    breakpoints,
    canonicalize_tools,
    hoist_volatile,
    prune_history,
    prune_rag,
    prune_tools,
    stabilise_passages,
)
from prefixgate.rewriter.region_memo import TailFree
from prefixgate.rewriter.types import Context, Edit, RewriteResult
from prefixgate.rewriter.wire import anthropic as wire_anthropic
from prefixgate.rewriter.wire import codec as wire
from prefixgate.rewriter.wire import openai as wire_openai
from prefixgate.rewriter.wire.forms import forms
from prefixgate.rewriter.wire.ir import Api, Prompt
from prefixgate.rewriter.wire.validate import Violations, new_violations, violations

PassFn = Callable[[Prompt, Context], tuple[Prompt, list[Edit]]]
UNCHANGED = "left the prompt unchanged"


class OverBudget(Exception):
    """The rewrite passed ``ctx.deadline``; ``stage`` names the pass (or ``render``) not run."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"time budget spent before {stage}")
        self.stage = stage


def check_deadline(ctx: Context, stage: str) -> None:
    """Raise :class:`OverBudget` when ``ctx.deadline`` (monotonic seconds) has passed."""
    if ctx.deadline is not None and time.monotonic() > ctx.deadline:
        raise OverBudget(stage)


def wire_bytes(value: Any) -> bytes:
    """Compact JSON of ``value`` in key order (orjson; stdlib json for integers over 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def same_wire(a: Prompt, b: Prompt) -> bool:
    """True when ``a`` and ``b`` render to the same bytes. Key order counts (dict ``==`` does
    not see a reordering); nodes shared by identity are not rendered, so a pass that touched
    one message costs one message's rendering."""
    if a is b:
        return True
    if (a.api, a.key_order, a.system_present) != (b.api, b.key_order, b.system_present):
        return False
    if a.params is not b.params and wire_bytes(a.params) != wire_bytes(b.params):
        return False
    if (a.tools is None) != (b.tools is None) or len(a.tools or ()) != len(b.tools or ()):
        return False
    for t, u in zip(a.tools or (), b.tools or ()):
        if t is not u and wire_bytes(t.raw) != wire_bytes(u.raw):
            return False
    render = wire_openai.render_message if a.api == "openai" else wire_anthropic.render_message
    for xs, ys in ((a.system, b.system), (a.messages, b.messages)):
        if len(xs) != len(ys):
            return False
        for m, n in zip(xs, ys):
            if m is not n and wire_bytes(render(m)) != wire_bytes(render(n)):
                return False
    return True


def _unapplied(edits: list[Edit], why: str) -> list[Edit]:
    """``edits`` with every applied one turned into ``applied=False`` (``why`` appended)."""
    return [replace(e, applied=False, detail=f"{e.detail} ({why})") if e.applied else e
            for e in edits]


@dataclass(frozen=True)
class PassSpec:
    """One pipeline stage: Edit name, ``RewriteSettings`` switch, module path (documentation:
    where ``fn`` lives), and ``fn``, the pass itself (None: the stage is skipped). ``reads``:
    for a pass that reads only the tool list, what else it reads (declared in its module), so
    ``ctx.memo`` may keep its output across requests (:mod:`prefixgate.rewriter.region_memo`);
    None: the pass runs on every request."""

    name: str
    switch: str
    module: str
    fn: PassFn | None = None
    reads: TailFree | None = None


PASSES: tuple[PassSpec, ...] = (
    PassSpec("canonicalize_tools", "canonicalize_tools", "prefixgate.rewriter.passes.canonicalize_tools",
             canonicalize_tools.run, canonicalize_tools.READS),
    PassSpec("hoist_volatile", "hoist_volatile", "prefixgate.rewriter.passes.hoist_volatile",
             hoist_volatile.run),
    PassSpec("stabilise_passages", "stabilise_passages", "prefixgate.rewriter.passes.stabilise_passages",
             stabilise_passages.run),
    PassSpec("prune_tools", "prune_tools", "prefixgate.rewriter.passes.prune_tools", prune_tools.run),
    PassSpec("prune_rag", "prune_rag", "prefixgate.rewriter.passes.prune_rag", prune_rag.run),
    PassSpec("prune_history", "prune_history", "prefixgate.rewriter.passes.prune_history",
             prune_history.run),
    PassSpec("place_breakpoints", "place_breakpoints", "prefixgate.rewriter.passes.breakpoints",
             breakpoints.run),
)


def _load(spec: PassSpec) -> PassFn | None:
    return spec.fn


MOVED_FORM = "mid_conversation_form_moved"
"""Why a pass's output is dropped when it moved, merged, edited or removed a mid-conversation
system message or tool-change / unknown block (:mod:`prefixgate.rewriter.wire.forms`)."""

Stage = tuple[str, Prompt, bool]
"""``(pass name, the prompt after it, whether it applied)``: one step of the stage chain."""


def run_passes(prompt: Prompt, ctx: Context, passes: tuple[PassSpec, ...] = PASSES,
               stages: list[Stage] | None = None) -> tuple[Prompt, list[Edit]]:
    """Run the enabled passes in order with per-pass validation (see module docstring).

    ``stages``, when given, receives a :data:`Stage` for each pass that ran (the prompt it
    kept: its input when its output was dropped; applied: any of the Edits it added is), in
    order — what :mod:`prefixgate.proxy.observe.stages` gets by running the passes one at a
    time (the passes are deterministic in the prompt and the context).
    The input's violations and form fingerprint are computed once and carried to the next pass
    (the output a pass keeps is the next one's input), and a pass that returns its input object
    is not validated (it cannot introduce a violation)."""
    edits: list[Edit] = []
    before: Violations | None = None  # violations(prompt), computed when first needed
    before_forms: tuple[Any, ...] | None = None  # forms(prompt), likewise
    for spec in passes:
        if not switch_on(ctx.settings, spec.switch):  # "guarded" unresolved: off
            continue
        fn = _load(spec)
        if fn is None:
            continue
        check_deadline(ctx, spec.name)
        try:
            if ctx.memo is not None and spec.reads is not None:
                out, pass_edits = ctx.memo.run_pass(spec.name, fn, spec.reads, prompt, ctx)
            else:
                out, pass_edits = fn(prompt, ctx)
        except Exception as e:  # noqa: BLE001 - fail-open: a broken pass must not break the request
            edits.append(Edit(spec.name, False, "all", f"pass failed, input kept: "
                              f"{type(e).__name__}: {str(e)[:200]}"))
            _stage(stages, spec.name, prompt, False)
            continue
        after: Violations | None = None
        after_forms: tuple[Any, ...] | None = None
        if out is not prompt:
            before = violations(prompt) if before is None else before
            after = violations(out)
            bad = new_violations(before, after)
            if not bad:
                before_forms = forms(prompt) if before_forms is None else before_forms
                after_forms = forms(out)
                if after_forms != before_forms:
                    bad = [MOVED_FORM]
            if bad:
                edits.append(Edit(spec.name, False, "all",
                                  "output invalid, input kept: " + ",".join(bad[:5])))
                _stage(stages, spec.name, prompt, False)
                continue
        kept = _unapplied(pass_edits, UNCHANGED) if same_wire(out, prompt) else pass_edits
        edits.extend(kept)  # a body that is its input's bytes is listed, never as applied
        if out is not prompt:  # same bytes or not, IR-only flags (``volatile``) reach later passes
            prompt, before, before_forms = out, after, after_forms
        _stage(stages, spec.name, prompt, any(e.applied for e in kept))
    return prompt, edits


def _stage(stages: list[Stage] | None, name: str, prompt: Prompt, applied: bool) -> None:
    if stages is not None:
        stages.append((name, prompt, applied))


def rewrite_request(body: dict[str, Any], api: Api, ctx: Context) -> RewriteResult:
    """Rewrite one request body for prefix-cache reuse.

    ``body``: Chat Completions (``api="openai"``) or Messages (``api="anthropic"``) request
    JSON; never mutated. Returns the body to send upstream (the same object when nothing
    changed, including when ``ctx.settings.enabled`` is False), every pass's Edits, and the
    ``stable_prefix_hash`` of the rewritten tools + system region. Deterministic: the same
    body and ``ctx.session`` give the same bytes. Raises ``ValueError`` only for an unknown api,
    :class:`OverBudget` past ``ctx.deadline``.
    """
    prompt = wire.parse(body, api)
    if not ctx.settings.enabled:
        return RewriteResult(body, [Edit("pipeline", False, "all", "rewrite disabled")],
                             _stable_hash(prompt, ctx))
    stages: list[Stage] = []
    out, edits = run_passes(prompt, ctx, stages=stages)
    if not any(e.applied for e in edits):
        return RewriteResult(body, edits, _stable_hash(out, ctx), tuple(stages))
    check_deadline(ctx, "render")
    final = wire.render(out)
    if wire_bytes(final) == wire_bytes(body):  # e.g. only IR-only flags changed
        return RewriteResult(body, _unapplied(edits, UNCHANGED), _stable_hash(out, ctx),
                             tuple(stages))
    return RewriteResult(final, edits, _stable_hash(out, ctx), tuple(stages))


def _stable_hash(prompt: Prompt, ctx: Context) -> str:
    """:func:`stable_prefix_hash`, through ``ctx.memo`` when there is one (same value)."""
    if ctx.memo is None:
        return stable_prefix_hash(prompt)
    return str(ctx.memo.stable_hash(prompt, marked_region(prompt), stable_prefix_hash))


def session_updates(result: RewriteResult) -> dict[str, Any]:
    """Merged ``Edit.memory`` of a result (later edits win): what the proxy writes back."""
    merged: dict[str, Any] = {}
    for e in result.edits:
        merged.update(e.memory)
    return merged
