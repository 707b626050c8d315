"""``prefixgate rewrite REQUEST.json [--policy FILE] [--provider P] [--api A] [--json]``.

What the proxy would send upstream for one request, offline: the same pass pipeline
(:func:`prefixgate.proxy.pipeline.rewrite.run_rewrite` over
:func:`prefixgate.rewriter.pipeline.rewrite_request`, the policy's
``rewrite`` switches, an empty session memory, no time budget), then

1. the rewritten body (pretty JSON, numbers as the client wrote them),
2. a unified diff of the pretty-printed original against it,
3. each Edit explained: pass, whether it applied, region, tokens before → after, the token offset
   of the first block it changed (prefix-cache order, :mod:`prefixgate.proxy.pipeline.edit_detail`), what it
   did or why it did nothing (the Edit's own ``detail``), and what the model now sees because of it.

``--provider`` (``anthropic | openai | radix``) picks whose cache rules the passes follow; by
default the policy's route for the body's ``model`` decides (``radix`` when no route matches).
``--api`` overrides the wire API guessed from the body. ``--json`` prints one object
``{api, provider, summary, tokens_pruned, body, diff, edits: [...], guarded: [...]}``.

A move whose mode is ``guarded`` (the shipped default, :mod:`prefixgate.config.guard_settings`)
is off here: the proxy turns it on per route only once the meaning guard's trial on that route's
backend has shown its answers keep, and this dry run has no verdict. The output names those
moves (``guarded``); set a move ``on`` in ``--policy`` to see what it would do. Exit 2 for a file that
is not a JSON object or a policy that does not load.
"""

from __future__ import annotations

import difflib
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import typer

from prefixgate.config.backend_kinds import traits
from prefixgate.config.guard_settings import guarded_moves
from prefixgate.config.loader import PolicyError, default_policy, load_policy, resolve_route
from prefixgate.config.schema import Policy, switch_on
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.pipeline.edit_detail import blocks_of, first_diff
from prefixgate.proxy.pipeline.rewrite import RewriteOutcome, default_rewrite_fn, run_rewrite
from prefixgate.rewriter.pipeline import PASSES, run_passes
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire import codec as rwire
from prefixgate.rewriter.wire.ir import Api, Prompt

# What the model reads differently after each pass (README "pass → what the model now sees").
WHAT_THE_MODEL_SEES: dict[str, str] = {
    "canonicalize_tools": "the same tools: a session's first request as sent, later ones in the "
                          "order and key order the session first saw (`tool_order: name`: sorted, "
                          "canonical keys)",
    "hoist_volatile": "a system prompt without the clock / id / changing line once it is seen "
                      "changing (a span in a longer line leaves `[see note n at the end]`), and "
                      "that line in a note after the conversation (a `<system-reminder>` block on "
                      "OpenAI Chat)",
    "stabilise_passages": "the same injected passages, each with its own label, in the order "
                          "the session first saw them; new passages after them",
    "prune_tools": "only the tools the conversation can need (those called, named in "
                   "`tool_choice` or the system text, pinned, or ranked relevant); on our "
                   "engine every tool, with calls outside that set masked (`allowed_tools`)",
    "prune_rag": "fewer retrieved passages: the best-scoring ones up to `rag_budget_tokens`, "
                 "without passages another one wholly contains, in canonical id order",
    "prune_history": "the first user turn and the newest turns; old tool results elided to "
                     "one line, old turns in between dropped",
    "place_breakpoints": "the same text; Anthropic `cache_control` markers (or OpenAI "
                         "`prompt_cache_key`) where the stable prefix ends",
}


@dataclass
class PassStep:
    """One pass's Edits and the token offset of the first block its output changed (None: the
    body's blocks did not change)."""

    edits: list[Edit]
    first_change: int | None


def trace_passes(body: dict[str, Any], api: Api, ctx: Context) -> list[PassStep]:
    """Run the enabled passes one at a time (the pipeline's own loop, one spec per call, so the
    result is the pipeline's), recording where each one's output first differs."""
    prompt: Prompt = rwire.parse(body, api)
    prev_blocks = blocks_of(body, api)
    steps: list[PassStep] = []
    if not ctx.settings.enabled:
        return steps
    for spec in PASSES:
        if not switch_on(ctx.settings, spec.switch):
            continue
        out, edits = run_passes(prompt, ctx, (spec,))
        change = None
        if any(e.applied for e in edits):
            blocks = blocks_of(rwire.render(out), api)
            change = first_diff(prev_blocks, blocks)
            prev_blocks = blocks
        steps.append(PassStep(edits, change))
        prompt = out
    return steps


WRAP = 100
"""Longest line of a diff: a string is shown split at its own newlines, then wrapped here."""


def readable_lines(body: dict[str, Any]) -> list[str]:
    """``body`` pretty-printed for a line diff (issue 22, item 7: a prompt was one very long
    line): JSON lines as :func:`prefixgate.proxy.core.exactjson.pretty` writes them, except that a
    string holding newlines or longer than :data:`WRAP` is shown as its own lines below the key,
    each prefixed ``| `` and wrapped at :data:`WRAP` columns, so a one-line change in a system
    prompt is a one-line diff. For reading only: the body sent is the JSON."""
    out: list[str] = []
    for line in exactjson.pretty(body).splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        key, sep, rest = stripped.partition('": "')
        value = rest[:-1] if rest.endswith('",') else rest[:-1] if rest.endswith('"') else None
        text = _string(f'"{value}"') if sep and value is not None else None
        if text is None or ("\n" not in text and len(line) <= WRAP):
            out.append(line)
            continue
        out.append(f'{indent}{key}": |')
        pad = indent + "  | "
        for part in text.split("\n"):
            out += textwrap.wrap(part, WRAP - len(pad), initial_indent=pad, subsequent_indent=pad,
                                 drop_whitespace=False, replace_whitespace=False) or [pad.rstrip()]
    return out


def _string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def unified_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Unified diff of the two bodies as :func:`readable_lines` (``original`` → ``rewritten``);
    "" when they print the same."""
    a, b = readable_lines(before), readable_lines(after)
    return "\n".join(difflib.unified_diff(a, b, "original", "rewritten", lineterm=""))


def edit_dicts(steps: list[PassStep]) -> list[dict[str, Any]]:
    """One explained dict per Edit: ``pass, applied, region, tokens_before, tokens_after,
    tokens_removed, first_change_token, detail, model_sees``."""
    out = []
    for step in steps:
        for e in step.edits:
            out.append({"pass": e.pass_name, "applied": e.applied, "region": e.region,
                        "tokens_before": e.tokens_before, "tokens_after": e.tokens_after,
                        "tokens_removed": e.tokens_removed,
                        "first_change_token": step.first_change if e.applied else None,
                        "detail": e.detail,
                        "model_sees": WHAT_THE_MODEL_SEES.get(e.pass_name, "") if e.applied
                        else "no change"})
    return out


def _provider(policy: Policy, model: str, given: str | None) -> str:
    if given:
        return given
    hit = resolve_route(policy, model)
    if hit is None:
        return "radix"
    return traits(hit[1].kind).cache_provider


def explain(body: dict[str, Any], raw: bytes, api: Api, policy: Policy,
            provider: str | None = None) -> tuple[RewriteOutcome, list[PassStep], str]:
    """The proxy's rewrite of ``body`` (``raw``: its bytes) under ``policy``, the per-pass
    trace, and the provider whose rules applied."""
    given = body.get("model")
    model = given if isinstance(given, str) else ""
    prov = _provider(policy, model, provider)
    hit = resolve_route(policy, model)
    masks = provider is None and hit is not None and traits(hit[1].kind).masks_tools  # as the proxy does
    ctx = Context(settings=policy.rewrite, model=model, provider=prov, session_id="cli",
                  masks_tools=masks)
    outcome = run_rewrite(default_rewrite_fn(), body, raw, api, ctx)
    return outcome, trace_passes(body, api, ctx), prov


GUARDED_NOTE = ("off in this dry run: the proxy turns a guarded move on per route only once a "
                "trial on that route's backend shows its answers keep (set it `on` in --policy "
                "to see what it would do)")


def _text_report(outcome: RewriteOutcome, diff: str, edits: list[dict[str, Any]],
                 guarded: list[str] | None = None) -> str:
    lines = ["== rewritten body ==", exactjson.pretty(outcome.body), "",
             "== diff (original -> rewritten) ==", diff or "(no change: the client's bytes go "
             "upstream as sent)", "", f"== edits ({outcome.summary}) =="]
    for i, e in enumerate(edits, 1):
        state = "applied" if e["applied"] else "skipped"
        where = "" if e["first_change_token"] is None else \
            f", first change at token {e['first_change_token']:,}"
        lines.append(f"{i}. {e['pass']} [{state}] {e['region']}: {e['tokens_before']:,} -> "
                     f"{e['tokens_after']:,} tokens{where}")
        lines.append(f"   what/why: {e['detail']}")
        if e["applied"]:
            lines.append(f"   the model now sees: {e['model_sees']}")
    if not edits:
        lines.append("(no pass ran: rewriting is off in this policy)")
    if guarded:
        lines += ["", f"== guarded: {', '.join(guarded)} ==", GUARDED_NOTE]
    return "\n".join(lines)


def rewrite(
    request: Path = typer.Argument(..., help="request body JSON (Chat Completions or Messages)"),
    policy: Path | None = typer.Option(None, "--policy", help="policy YAML (default: shipped)"),
    provider: str | None = typer.Option(None, "--provider",
                                        help="anthropic | openai | radix (default: by route)"),
    api: str | None = typer.Option(None, "--api", help="openai | anthropic (default: guessed)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Show what the proxy would send upstream for REQUEST, and why."""
    if provider not in (None, "anthropic", "openai", "radix"):
        typer.echo(f"--provider must be anthropic, openai or radix, not {provider!r}", err=True)
        raise typer.Exit(2)
    if api not in (None, "openai", "anthropic"):
        typer.echo(f"--api must be openai or anthropic, not {api!r}", err=True)
        raise typer.Exit(2)
    try:
        pol = load_policy(policy) if policy else default_policy()
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    try:
        raw = request.read_bytes()
    except OSError as e:
        typer.echo(f"{request}: cannot read: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    try:
        body = exactjson.loads(raw)  # the proxy's own parser: every number's text kept
    except ValueError as e:
        typer.echo(f"{request}: not valid JSON: {e}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(body, dict):
        typer.echo(f"{request}: not a request body (a JSON object: a Chat Completions or "
                   "Messages request)", err=True)
        raise typer.Exit(2)
    from prefixgate.cache.provider_models.prefix_blocks import detect_api

    wire_api: Literal["openai", "anthropic"] = api or detect_api(body)  # type: ignore[assignment]
    outcome, steps, prov = explain(body, raw, wire_api, pol, provider)
    diff = unified_diff(body, outcome.body)
    edits = edit_dicts(steps)
    guarded = guarded_moves(pol.rewrite) if pol.rewrite.enabled else []  # off in a dry run
    if as_json:
        typer.echo(json.dumps({"api": wire_api, "provider": prov, "summary": outcome.summary,
                               "tokens_pruned": outcome.pruned,
                               "body": json.loads(exactjson.dumps(outcome.body)),
                               "diff": diff, "edits": edits, "guarded": guarded},
                              indent=2, ensure_ascii=False))
        return
    typer.echo(_text_report(outcome, diff, edits, guarded))


def register(app: typer.Typer) -> None:
    """Add ``prefixgate rewrite``."""
    app.command("rewrite")(rewrite)

