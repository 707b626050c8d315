"""What broke the prefix cache, what it cost and how to fix it: the one explanation that plain
``prefixgate report``, the dashboard's first card and ``/api/savings`` all show (issue 37).

Input: the ledger's break records (:mod:`prefixgate.cache.savings.client_breaks`: the client's
breaks that cost the backend reuse, each with its masked excerpt, the route, backend and model)
and the range's request rows. :func:`explain_breaks` groups records by cause — (kind, region,
masked excerpt; the detail where there is no excerpt) — largest loss first, each group:

- **what**: ``kind``, ``cause`` (a sentence), ``excerpt`` (masked: volatile spans named,
  digits ``#``), ``field`` (region) and ``line``, ``where`` (a sentence);
- **where in tokens**: ``token_offset`` (the smallest of the group; ``token_offset_max`` the
  largest), ``unit`` (``engine``: the backend's own token ids from the start of the rendered
  prompt; ``estimate``: tiktoken over the blocks in the API's order; ``mixed``), ``unit_text``;
- **cost**: ``count`` (breaks), ``sessions``, ``tokens_lost`` (prompt tokens the backend
  prefilled again that the previous request had cached), ``share`` (of the range's prompt
  tokens), ``seconds_lost`` (self-hosted: each record's tokens at its (route, backend) prefill
  rate, :mod:`prefixgate.cache.savings.time_saved`; None where no engine reports prefill time),
  ``usd_lost`` (hosted: each record's tokens at its model's input minus cache-read price,
  :mod:`prefixgate.config.prices`; None where unpriced or free);
- **fix**: ``fix`` (a policy line, or "" where no policy setting fixes it) and ``fix_note``
  (what it does, or what to change in the agent). A changing system line on requests the hoist
  already rewrote (record ``hoist_on``) has no policy line left: the hoist moves it from the
  session's second request on, so what is left is each session's first change.

A break our engine bridged (record ``bridged_tokens`` > 0: it reused the KV after the changed
span, issue 33) costs nothing: counted in ``bridged`` / ``bridged_tokens``, never in
``tokens_lost``; a cause every one of whose breaks was bridged gets :data:`BRIDGED_NOTE` as its
fix, and is never the top break. Breaks of holdout requests (record ``holdout``: sent
unrewritten on purpose, to measure against) are left out: they are the comparison arm, not something to fix.

:func:`top_break` is the first group when it costs at least :data:`MIN_SHARE` of the range's
prompt tokens (:data:`MIN_TOKENS` when no prompt tokens are known); :func:`format_top_break`
its lines for a terminal.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixgate.cache.savings.time_saved import rates
from prefixgate.config.prices import price_for

MIN_SHARE = 0.05
"""A break group is the top break when it lost at least this share of the range's prompt tokens."""
MIN_TOKENS = 1000
"""... or, with no prompt tokens known, at least this many tokens."""

_SPAN_NAMES = {"datetime": "clock", "time": "clock", "date": "date", "uuid": "id",
               "hex_id": "id", "request_id": "request id", "unix_ts": "timestamp"}
_REGION_NAMES = {"system": "system prompt", "tools": "tool list", "messages": "conversation"}
HOIST_FIX = "rewrite: {hoist_volatile: true}"
"""The policy line that moves a changing system line after the conversation."""
FIXES: dict[str, tuple[str, str]] = {
    "volatile_span": (HOIST_FIX, "moves the changing line after the conversation, so "
                      "everything before it is reused (by default `guarded`: the model reads "
                      "the line elsewhere; README, \"What prefixgate changes\")"),
    "reorder": ("rewrite: {canonicalize_tools: true, tool_order: name}",
                "sends the tools in one order on every request"),
    "tool_set_changed": ("", "send the same tools on every turn of a session (the whole list "
                             "from its first request): a changed tool list breaks everything "
                             "after it"),
    "system_edit": ("", "keep the system prompt the same across turns; put what changes in "
                        "the newest user message"),
    "history_edit": ("", "the agent edits or drops earlier turns: keep them as sent, or trim "
                         "history in larger, rarer steps"),
    "model_changed": ("", "keep one model per session: each model has its own cache"),
}
"""kind -> (policy line or "", what it does / what to change in the agent)."""
HOIST_ON_NOTE = ("hoist_volatile is on: the line moves from each session's second request on, "
                 "so each session's first change is left (to avoid it, send the value in the "
                 "newest message)")


def cause_of(kind: str, region: str, volatile_kinds: Sequence[str], detail: str) -> str:
    """One sentence naming what broke the prefix."""
    where = _REGION_NAMES.get(region, region)
    if kind == "volatile_span":
        names = sorted({_SPAN_NAMES.get(k, k) for k in volatile_kinds}) or ["value"]
        return f"a {' / '.join(names)} in the {where} changes on every request"
    if kind == "reorder":
        return f"the same {where} arrives in another order"
    if kind == "tool_set_changed":
        return f"the tool list changed ({detail})"
    if kind == "system_edit":
        return "the system prompt changed"
    if kind == "history_edit":
        return f"an earlier turn was edited or removed ({detail})"
    if kind == "model_changed":
        return "the model changed within a session"
    return detail or kind


def fix_for(kind: str, region: str) -> tuple[str, str]:
    """(policy line or "", note) for a break of ``kind`` in ``region``: the hoist moves only
    system lines, so a changing value in the conversation is the agent's to fix."""
    if kind == "volatile_span" and region != "system":
        return "", ("a changing clock / id inside earlier turns: keep earlier turns as sent "
                    "(put the value in the newest message only)")
    if kind == "reorder" and region != "tools":
        return "", f"send the {_REGION_NAMES.get(region, region)} in one order"
    return FIXES.get(kind, ("", ""))


def unit_text(unit: str, model: str, tokenizer: str = "") -> str:
    """What a group's token offsets count, in words (``tokenizer``: the tiktoken encoding an
    estimate used, when the record names it)."""
    if unit == "engine":
        return (f"{model or 'the backend'}'s own tokens (its /tokenize), from the start of the "
                "rendered prompt")
    if unit == "estimate":
        return (f"tokens estimated with tiktoken {tokenizer or ''}".rstrip()
                + ", counting tools, then system, then messages")
    return "some in the backend's own tokens, some estimated"


def _loss_per_token(model: str) -> float | None:
    """USD per token a miss costs over a hit for ``model`` (None: unpriced or free)."""
    p = price_for(model) if model else None
    if p is None or p.input <= 0:
        return None
    return (p.input - p.cached_input) / 1e6


BRIDGED_NOTE = ("the engine bridges it: it reused the KV after the changed span (span reuse, "
                "issue 33), so the prefix was not lost and no move is needed")


def explain_breaks(records: Iterable[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
                   limit: int = 10) -> list[dict[str, Any]]:
    """Break records grouped by cause with their cost and fix (module docstring), the
    ``limit`` largest losses first."""
    known = rates(rows)
    prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
    acc: dict[tuple[str, str, str], dict[str, Any]] = {}
    for b in records:
        if b.get("holdout"):
            continue  # the holdout arm is unrewritten on purpose (module docstring)
        kind, region = str(b.get("kind", "")), str(b.get("region", ""))
        excerpt = str(b.get("excerpt") or "")
        key = (kind, region, excerpt or str(b.get("detail", "")))
        e = acc.get(key)
        if e is None:
            fix, note = fix_for(kind, region)
            e = acc[key] = {
                "kind": kind, "field": region,
                "cause": cause_of(kind, region, b.get("volatile_kinds") or (), str(
                    b.get("detail", ""))),
                "excerpt": excerpt, "line": int(b.get("line") or 0), "detail": b.get("detail", ""),
                "token_offset": None, "token_offset_max": None, "units": set(), "model": "",
                "tokenizer": "",
                "count": 0, "sessions": set(), "tokens_lost": 0, "seconds_lost": None,
                "usd_lost": None, "fix": fix, "fix_note": note, "bridged": 0, "bridged_tokens": 0}
        reused = int(b.get("bridged_tokens") or 0)  # the engine reused the KV after the span
        lost = 0 if reused > 0 else int(b.get("tokens_lost") or 0)
        if reused > 0:
            e["bridged"] += 1
            e["bridged_tokens"] += reused
        off = int(b.get("token_offset") or 0)
        e["token_offset"] = off if e["token_offset"] is None else min(e["token_offset"], off)
        e["token_offset_max"] = max(e["token_offset_max"] or 0, off)
        e["units"].add(str(b.get("unit") or "estimate"))
        e["model"] = e["model"] or str(b.get("model") or "")
        e["tokenizer"] = e["tokenizer"] or str(b.get("tokenizer") or "")
        if b.get("hoist_on") and kind == "volatile_span" and region == "system":
            e["fix"], e["fix_note"] = "", HOIST_ON_NOTE
        e["count"] += 1
        e["sessions"].add(b.get("session_id"))
        e["tokens_lost"] += lost
        rate = known.get((b.get("route") or "-", b.get("backend") or "-"))
        if rate is not None:
            e["seconds_lost"] = (e["seconds_lost"] or 0.0) + lost * rate.ms_per_token / 1000
        per = _loss_per_token(str(b.get("model") or ""))
        if per is not None:
            e["usd_lost"] = (e["usd_lost"] or 0.0) + lost * per
    out = []
    for e in sorted(acc.values(), key=lambda e: (-e["tokens_lost"], -e["count"]))[:limit]:
        if e["bridged"] == e["count"]:  # every one bridged by the engine: nothing to fix
            e["fix"], e["fix_note"] = "", BRIDGED_NOTE
        units = e.pop("units")
        unit = units.pop() if len(units) == 1 else "mixed"
        e.update(unit=unit, unit_text=unit_text(unit, e["model"], e["tokenizer"]),
                 sessions=len(e["sessions"]),
                 share=round(e["tokens_lost"] / prompt, 6) if prompt else None,
                 where=where_of(e["field"], e["line"]),
                 seconds_lost=None if e["seconds_lost"] is None else round(e["seconds_lost"], 3),
                 usd_lost=None if e["usd_lost"] is None else round(e["usd_lost"], 8))
        out.append(e)
    return out


def where_of(region: str, line: int) -> str:
    """``"system prompt, line 2"``."""
    name = _REGION_NAMES.get(region, region)
    return f"{name}, line {line}" if line else name


def top_break(explained: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
              ) -> dict[str, Any] | None:
    """The first of ``explained`` (:func:`explain_breaks`) when it lost at least
    :data:`MIN_SHARE` of ``rows``' prompt tokens (:data:`MIN_TOKENS` without any), else None."""
    if not explained:
        return None
    top = explained[0]
    prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
    need = MIN_SHARE * prompt if prompt else MIN_TOKENS
    return dict(top) if top["tokens_lost"] >= need and top["tokens_lost"] > 0 else None


def _cost(t: Mapping[str, Any]) -> str:
    parts = [f"{t['tokens_lost']:,} prompt tokens prefilled again"
             + (f" ({100 * t['share']:.0f}% of all prompt tokens)" if t.get("share") else "")]
    if t.get("seconds_lost") is not None:
        parts.append(f"{t['seconds_lost']:,.1f} s of prefill")
    if t.get("usd_lost") is not None:
        parts.append(f"${t['usd_lost']:,.4f}")
    return " · ".join(parts)


def format_top_break(t: Mapping[str, Any], width: int = 80) -> list[str]:
    """The report's lines for the top break (:func:`top_break`), each at most ``width``
    columns: cause and count, the masked excerpt and where, the cost, the fix."""
    at = (f"token {t['token_offset']:,}" if t["token_offset"] == t["token_offset_max"]
          else f"tokens {t['token_offset']:,}-{t['token_offset_max']:,}")
    times = f"{t['count']:,} time{'s' if t['count'] != 1 else ''}"
    sess = f"{t['sessions']:,} session{'s' if t['sessions'] != 1 else ''}"
    paras = [
        (f"top cache break: {t['cause']} ({times}, {sess})", ""),
        ((f"\"{t['excerpt']}\" · " if t["excerpt"] else "") + f"{t['where']} · the prefix "
         f"breaks at {at}: {t['unit_text']}", "  "),
        (f"cost: {_cost(t)}", "  "),
        (f"fix: {t['fix']} — {t['fix_note']}" if t["fix"] else f"fix: {t['fix_note']}", "  "),
    ]
    lines: list[str] = []
    for text, indent in paras:
        lines += textwrap.wrap(text, width, initial_indent=indent, subsequent_indent="    ")
    return lines
