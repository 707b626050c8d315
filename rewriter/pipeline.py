"""The rewrite pipeline: :func:`rewrite_request`, the public entry point of ``rewriter``.

Order (DESIGN.md, "A request's path" step 4)::

    canonicalize_tools -> hoist_volatile -> prune_tools -> prune_rag -> prune_history
    -> place_breakpoints

Each pass is a module exposing ``run(prompt: Prompt, ctx: Context) -> (Prompt, list[Edit])``,
listed in :data:`PASSES` with the ``RewriteSettings`` switch that turns it on. A module that is
not installed yet is skipped. Fail-open, per pass: if a pass raises, or its output breaks an API
rule its input did not break (:func:`rewriter.validate.introduced`), its output is dropped, its
memory updates too, and an ``Edit(applied=False)`` says why; the next pass runs on its input.
When nothing applied, the caller's body object is returned as is (byte-identical forwarding).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from rewriter import wire
from rewriter.ir import Api, Prompt
from rewriter.stable import stable_prefix_hash
from rewriter.types import Context, Edit, RewriteResult
from rewriter.validate import introduced

PassFn = Callable[[Prompt, Context], tuple[Prompt, list[Edit]]]


@dataclass(frozen=True)
class PassSpec:
    """One pipeline stage: Edit name, ``RewriteSettings`` switch, module path (has ``run``).

    ``fn`` overrides the module lookup (tests, experiments).
    """

    name: str
    switch: str
    module: str
    fn: PassFn | None = None


PASSES: tuple[PassSpec, ...] = (
    PassSpec("canonicalize_tools", "canonicalize_tools", "rewriter.canonicalize_tools"),
    PassSpec("hoist_volatile", "hoist_volatile", "rewriter.hoist_volatile"),
    PassSpec("prune_tools", "prune_tools", "rewriter.prune_tools"),
    PassSpec("prune_rag", "prune_rag", "rewriter.prune_rag"),
    PassSpec("prune_history", "prune_history", "rewriter.prune_history"),
    PassSpec("place_breakpoints", "place_breakpoints", "rewriter.breakpoints"),
)


def _load(spec: PassSpec) -> PassFn | None:
    if spec.fn is not None:
        return spec.fn
    return _load_module(spec.module)


@lru_cache(maxsize=64)
def _load_module(module: str) -> PassFn | None:
    try:
        mod: ModuleType = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise
    fn = getattr(mod, "run", None)
    return fn if callable(fn) else None


def run_passes(prompt: Prompt, ctx: Context,
               passes: tuple[PassSpec, ...] = PASSES) -> tuple[Prompt, list[Edit]]:
    """Run the enabled passes in order with per-pass validation (see module docstring)."""
    edits: list[Edit] = []
    for spec in passes:
        if not getattr(ctx.settings, spec.switch, False):
            continue
        fn = _load(spec)
        if fn is None:
            continue
        try:
            out, pass_edits = fn(prompt, ctx)
        except Exception as e:  # noqa: BLE001 - fail-open: a broken pass must not break the request
            edits.append(Edit(spec.name, False, "all", f"pass failed, input kept: "
                              f"{type(e).__name__}: {str(e)[:200]}"))
            continue
        bad = introduced(prompt, out)
        if bad:
            edits.append(Edit(spec.name, False, "all",
                              "output invalid, input kept: " + ",".join(bad[:5])))
            continue
        edits.extend(pass_edits)
        prompt = out
    return prompt, edits


def rewrite_request(body: dict[str, Any], api: Api, ctx: Context) -> RewriteResult:
    """Rewrite one request body for prefix-cache reuse.

    ``body``: Chat Completions (``api="openai"``) or Messages (``api="anthropic"``) request
    JSON; never mutated. Returns the body to send upstream (the same object when nothing
    changed, including when ``ctx.settings.enabled`` is False), every pass's Edits, and the
    ``stable_prefix_hash`` of the rewritten tools + system region. Deterministic: the same
    body and ``ctx.session`` give the same bytes. Raises ``ValueError`` only for an unknown api.
    """
    prompt = wire.parse(body, api)
    if not ctx.settings.enabled:
        return RewriteResult(body, [Edit("pipeline", False, "all", "rewrite disabled")],
                             stable_prefix_hash(prompt))
    out, edits = run_passes(prompt, ctx)
    changed = any(e.applied for e in edits)
    final = wire.render(out) if changed else body
    return RewriteResult(final, edits, stable_prefix_hash(out))


def session_updates(result: RewriteResult) -> dict[str, Any]:
    """Merged ``Edit.memory`` of a result (later edits win): what the proxy writes back."""
    merged: dict[str, Any] = {}
    for e in result.edits:
        merged.update(e.memory)
    return merged
