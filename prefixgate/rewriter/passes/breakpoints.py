"""Pass: place cache breakpoints (Anthropic) / cache routing params (OpenAI).

Anthropic rules (https://platform.claude.com/docs/en/build-with-claude/prompt-caching, read
2026-11-29; constants in ``prefixgate/config/cache_rules.py``):

* at most 4 ``cache_control`` breakpoints per request, a top-level ``cache_control``
  (automatic caching) taking one slot; the client's own markers are never removed or moved and
  are counted wherever the API allows them, blocks nested in ``tool_result`` / ``search_result``
  / ``document`` included (:func:`prefixgate.rewriter.wire.validate.cache_markers`, issue 8 class 4);
* the cache prefix runs tools -> system -> messages; at each breakpoint the API looks for a
  cache hit at up to 20 block boundaries before it (the lookback window), so consecutive
  breakpoints more than 20 blocks apart can miss an earlier write;
* a prefix below the model's minimum cacheable length is silently not cached
  (:func:`prefixgate.config.cache_rules.min_cacheable_tokens`), so no marker is placed there;
* ``ttl: "1h"`` breakpoints must come before ``5m`` ones;
* ``cache_control`` can sit on tools, system text blocks and message content blocks (text,
  image, document, tool_use, tool_result, search_result), not on thinking blocks.

Plan (priority order while the 4-slot budget lasts): ``M`` the newest stable block (the last
block before the first volatile one — the hoisted note, or a clock still in the system prompt —
so the next request of the session reads everything up to it); ``S`` end of system; the block the
previous request of the session marked as ``M`` when it is more than 20 blocks back (a sure
read, kept in ``Edit.memory["breakpoints"]``); ``T`` end of tools; then extra markers so no two
breakpoints are more than 20 blocks apart. Never on or after a volatile block (case B03).

OpenAI (https://developers.openai.com/api/docs/guides/prompt-caching): caching is automatic;
requests are routed by a hash of the first ~256 prompt tokens combined with ``prompt_cache_key``,
and more than ~15 requests a minute for one prefix+key overflow to further machines, which start
cold. So when ``settings.openai_prompt_cache_key`` (on by default: the key is request metadata,
the model never reads it), ``prompt_cache_key`` = :func:`conversation_key`, ``"<tenant>-<first
16 hex of sha256(session id)>"``: one key per conversation, so a conversation's turns stay on
the machine that holds its suffix however many conversations share the system prompt (Codex CLI
keys by conversation id the same way). Without a session id (``prefixgate rewrite`` on one body)
the stable-prefix hash stands in. ``prompt_cache_retention`` from policy. A client's own values
are kept. Only for ``ctx.provider == "openai"`` (other OpenAI-compatible servers may reject
unknown fields; the fallbacks of another kind get the client's body,
:func:`prefixgate.proxy.pipeline.prepare.bridges`); on an Anthropic client's body bridged to an
OpenAI backend too, where the A->O bridge carries the two fields over (a bridged path without
the key cached 28 % against 49 % native in neurolink #1766).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from prefixgate.config.cache_rules import (
    ANTHROPIC_LOOKBACK_BLOCKS,
    ANTHROPIC_MAX_BREAKPOINTS,
    ANTHROPIC_TTL_1H_BETA,
    ANTHROPIC_TTL_1H_REQUIRES_BETA,
    OPENAI_MIN_PROMPT_TOKENS,
    min_cacheable_tokens,
)
from prefixgate.rewriter.analysis import ttl_choice
from prefixgate.rewriter.analysis.stable import stable_prefix_hash
from prefixgate.rewriter.analysis.tokens import json_tokens, media_tokens
from prefixgate.rewriter.analysis.volatile_spans import find_spans
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.forms import trailing_system_start
from prefixgate.rewriter.wire.ir import Block, Prompt, Tool, iter_blocks
from prefixgate.rewriter.wire.validate import breakpoint_count, cache_markers

NAME = "place_breakpoints"
MEMORY_KEY = "breakpoints"
MARKABLE = frozenset({"text", "image", "document", "tool_use", "tool_result", "search_result"})


@dataclass(frozen=True)
class Unit:
    """One cacheable block in prefix order: ``region``, message / block index, the node."""

    region: str
    mi: int
    bi: int
    node: Block | Tool

    @property
    def label(self) -> str:
        """``tools[3]``, ``system[0]``, ``messages[5].1``."""
        if self.region == "tools":
            return f"tools[{self.bi}]"
        if self.region == "system":
            return f"system[{self.bi}]"
        return f"messages[{self.mi}].{self.bi}"


def _units(prompt: Prompt) -> list[Unit]:
    return [Unit(r, mi, bi, n) for r, mi, bi, n in iter_blocks(prompt)]


def _unit_text(u: Unit) -> str:
    n = u.node
    if isinstance(n, Tool):
        return json.dumps(n.raw, ensure_ascii=False)
    if n.is_text or n.type == "thinking":
        return n.text
    if n.type == "tool_result":
        return n.result_text() or json.dumps(n.raw.get("content"), ensure_ascii=False)
    if n.type == "tool_use":
        return json.dumps(n.raw.get("input", n.raw.get("function")), ensure_ascii=False)
    return ""


def _unit_tokens(u: Unit, ctx: Context) -> int:
    """Tokens of one unit: text through ``ctx.count_tokens``; media (also inside a tool result) at
    the fixed cost of :func:`prefixgate.rewriter.analysis.tokens.media_tokens`; a text document by
    its source's text."""
    n = u.node
    if isinstance(n, Block):
        cost = media_tokens(n.raw)
        if cost is not None:
            return cost
        if n.type == "document":
            return json_tokens(n.raw.get("source"), ctx.count_tokens)
        if n.type == "tool_result" and isinstance(n.raw.get("content"), list):
            parts = n.raw["content"]
            media = sum(media_tokens(p) or 0 for p in parts)
            return media + ctx.count_tokens(_unit_text(u) if n.result_text() else "")
    return ctx.count_tokens(_unit_text(u))


def _unit_hash(u: Unit) -> str:
    raw = u.node.raw
    data = json.dumps({k: v for k, v in raw.items() if k != "cache_control"}, sort_keys=True)
    return hashlib.sha256(f"{u.label}|{data}".encode()).hexdigest()[:16]


def _markable(u: Unit) -> bool:
    if isinstance(u.node, Tool):
        return True
    b = u.node
    if b.type not in MARKABLE or b.volatile:
        return False
    return not (b.type == "text" and b.raw.get("text") == "")


def _is_volatile(u: Unit) -> bool:
    """Flagged by a pass (the hoisted note), or a system block still holding a clock / id.

    Tool definitions are not scanned: they come from code, and a date in a description is
    nearly always an example; a tool that really changes is reported by ``hoist_volatile``.
    """
    n = u.node
    if isinstance(n, Tool):
        return False
    if n.volatile:
        return True
    return u.region == "system" and bool(find_spans(n.text))


def _markable_at_or_before(units: list[Unit], i: int, lo: int) -> int | None:
    while i > lo:
        if _markable(units[i]):
            return i
        i -= 1
    return None


def _ttl_plan(ours: list[int], client: list[tuple[float, str]],
              want: str | dict[int, str]) -> dict[int, str]:
    """TTL for each of our positions so that no 1h marker follows a 5m one; a position that
    cannot be given either (a client 5m before it and a client 1h after it) is left out.
    ``client``: ``(position, ttl)`` of the client's markers (a marker nested inside unit ``i``
    sits at ``i - 0.5``: before the unit's own end). ``want``: one TTL, or one per position
    (already 1h-before-5m among ours)."""
    out: dict[int, str] = {}
    for p in ours:
        earlier_5m = any(t == "5m" for q, t in client if q < p)
        later_1h = any(t == "1h" for q, t in client if q > p)
        if earlier_5m and later_1h:
            continue
        w = want.get(p, "5m") if isinstance(want, dict) else want
        out[p] = "5m" if earlier_5m else ("1h" if later_1h else w)
    return out


def _arrivals(prompt: Prompt, ctx: Context) -> tuple[list[float], dict[str, Any]]:
    """``(gaps that decide an auto TTL, arrivals memory update)``
    (:mod:`prefixgate.rewriter.analysis.ttl_choice`);
    arrival times are learned whenever ``ctx.now_s`` is known."""
    mem = ctx.session.get(ttl_choice.MEMORY_KEY)
    kind = ttl_choice.request_kind(prompt)
    update = {} if ctx.now_s is None else {
        ttl_choice.MEMORY_KEY: ttl_choice.updated(mem, ctx.now_s, kind)}
    return ttl_choice.samples(mem, kind), update


def _auto_ttls(chosen: list[int], cum: list[int], cached_before: int, gaps: list[float],
               notes: list[str]) -> dict[int, str]:
    """Per-breakpoint TTLs by expected cost (:func:`prefixgate.rewriter.analysis.ttl_choice.plan`):
    segment ``i`` runs from breakpoint ``i-1`` to ``i``; the part past ``cached_before`` (tokens the
    session's previous request cached) is written now."""
    order = sorted(chosen)
    segments, prev = [], 0
    for p in order:
        segments.append((cum[p] - prev, max(0, cum[p] - max(prev, cached_before))))
        prev = cum[p]
    ttls, why = ttl_choice.plan(segments, gaps)
    if gaps:
        notes.append(why)
    return dict(zip(order, ttls))


def _anthropic(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    units = _units(prompt)
    notes: list[str] = []
    arrival_gaps, arrivals = _arrivals(prompt, ctx)
    if not units:
        return prompt, [Edit(NAME, False, "messages", "nothing to cache", memory=arrivals)]
    found = cache_markers(prompt)
    client_marks = [(i - 0.5 if nested else float(i), ttl) for i, nested, ttl in found]
    auto = prompt.params.get("cache_control")
    if isinstance(auto, dict):  # automatic caching: a breakpoint after the last block
        client_marks.append((float(len(units)), str(auto.get("ttl", "5m"))))
    client = {i for i, _, _ in found}
    budget = ANTHROPIC_MAX_BREAKPOINTS - breakpoint_count(prompt)
    if budget <= 0:
        return prompt, [Edit(NAME, False, "messages", f"client uses all "
                             f"{ANTHROPIC_MAX_BREAKPOINTS} breakpoints: left as sent",
                             memory=arrivals)]
    volatile = next((i for i, u in enumerate(units) if _is_volatile(u)), len(units))
    limit = volatile
    trail = trailing_system_start(prompt)
    if trail < len(prompt.messages):  # never on a trailing system message (Claude Code #96101)
        first = next((i for i, u in enumerate(units) if u.region == "messages" and u.mi >= trail),
                     len(units))
        if first < limit:
            limit = first
            notes.append(f"trailing system message from messages[{trail}]: not marked")
    cum: list[int] = []
    total = 0
    for u in units[:limit]:
        total += _unit_tokens(u, ctx)
        cum.append(total)
    floor = min_cacheable_tokens(ctx.model or prompt.model)
    if volatile < len(units) and volatile == limit:
        notes.append(f"volatile from {units[limit].label}")

    def ok(i: int | None, what: str) -> int | None:
        if i is None:
            return None
        if cum[i] < floor:
            notes.append(f"{what} skipped: prefix {cum[i]} < {floor} tokens")
            return None
        return i

    def last_in(region: str) -> int | None:
        idx = [i for i in range(limit) if units[i].region == region]
        return _markable_at_or_before(units, idx[-1], -1) if idx else None

    last_msg = _markable_at_or_before(units, limit - 1, -1) if limit else None
    m = ok(last_msg if last_msg is not None and units[last_msg].region == "messages" else None,
           "messages breakpoint")
    s = ok(last_in("system"), "system breakpoint")
    mem = ctx.session.get(MEMORY_KEY) or {}
    prev = None
    p_i = mem.get("last")
    if isinstance(p_i, int) and m is not None and 0 <= p_i < m - ANTHROPIC_LOOKBACK_BLOCKS \
            and _unit_hash(units[p_i]) == mem.get("hash") and _markable(units[p_i]):
        prev = ok(p_i, "previous messages breakpoint")
    t = ok(last_in("tools"), "tools breakpoint")
    chosen: list[int] = []
    for c in (m, s, prev, t):
        if c is not None and c not in client and c not in chosen and len(chosen) < budget:
            chosen.append(c)
    while len(chosen) < budget:  # lookback spacing
        marks = sorted(set(chosen) | {c for c in client if c < limit})
        gaps = [(b - a, a, b) for a, b in pairwise(marks) if b - a > ANTHROPIC_LOOKBACK_BLOCKS]
        if not gaps:
            break
        _, a, b = max(gaps)
        x = ok(_markable_at_or_before(units, b - ANTHROPIC_LOOKBACK_BLOCKS, a), "spacing breakpoint")
        if x is None or x in chosen:
            break
        chosen.append(x)
    want: str | dict[int, str] = ctx.settings.breakpoint_ttl
    if want == "auto":
        tokens = mem.get("tokens")
        before = tokens if isinstance(tokens, int) else 0
        want = _auto_ttls(chosen, cum, before, arrival_gaps, notes)
    wants_1h = "1h" in (want.values() if isinstance(want, dict) else (want,))
    if wants_1h and ANTHROPIC_TTL_1H_REQUIRES_BETA and ANTHROPIC_TTL_1H_BETA not in ctx.betas:
        notes.append(f"ttl 1h needs beta {ANTHROPIC_TTL_1H_BETA}: using 5m")
        want = "5m"
    ttls = _ttl_plan(chosen, client_marks, want)
    placed = sorted(p for p in chosen if p in ttls)
    memory: dict[str, Any] = dict(arrivals)
    if m is not None:
        memory[MEMORY_KEY] = {"last": m, "hash": _unit_hash(units[m]), "tokens": cum[m]}
    if not placed:
        return prompt, [Edit(NAME, False, "messages", "no breakpoint placed: "
                             + ("; ".join(notes) or "nothing eligible"), memory=memory)]
    out = _apply(prompt, units, {p: ttls[p] for p in placed})
    labels = ",".join(f"{units[p].label}" + ("(1h)" if ttls[p] == "1h" else "") for p in placed)
    detail = f"placed {len(placed)} breakpoint(s) at {labels}; client kept {len(found)}"
    if notes:
        detail += "; " + "; ".join(notes)
    cached = cum[placed[-1]]
    return out, [Edit(NAME, True, "messages", detail, cached, cached, memory=memory,
                      tokens_reusable=cached)]


def _marker(ttl: str) -> dict[str, Any]:
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def _apply(prompt: Prompt, units: list[Unit], marks: dict[int, str]) -> Prompt:
    tools = list(prompt.tools or ())
    system = [list(m.blocks) for m in prompt.system]
    msgs = [list(m.blocks) for m in prompt.messages]
    for p, ttl in marks.items():
        u = units[p]
        if u.region == "tools":
            tools[u.bi] = tools[u.bi].with_cache_control(_marker(ttl))
        else:
            target = system if u.region == "system" else msgs
            target[u.mi][u.bi] = target[u.mi][u.bi].with_cache_control(_marker(ttl))
    return replace(
        prompt,
        tools=tuple(tools) if prompt.tools is not None else None,
        system=tuple(m.with_blocks(b) for m, b in zip(prompt.system, system)),
        messages=tuple(m.with_blocks(b) for m, b in zip(prompt.messages, msgs)),
    )


CACHE_PARAMS = ("prompt_cache_key", "prompt_cache_retention")
"""The OpenAI request fields this pass may add: routing / retention metadata, never read by the
model, known only to the backends whose kind says so (:mod:`prefixgate.config.backend_kinds`)."""


def conversation_key(tenant: str, session_id: str) -> str:
    """The ``prompt_cache_key`` prefixgate sends for one conversation: ``"<tenant>-<16 hex>"``,
    the hex being the first 16 of sha256 of the session id (the id itself never leaves the
    proxy; at most ``len(tenant) + 17`` characters)."""
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{tenant}-{digest}"


def _chars_reach(prompt: Prompt, limit: int) -> bool:
    """Whether the prompt holds at least ``limit`` characters (tools' JSON, text blocks' text,
    other blocks' JSON), counting no further than ``limit``. A token is at least one character,
    so a prompt short of ``OPENAI_MIN_PROMPT_TOKENS`` characters is short of that many tokens."""
    seen = 0
    for _, _, _, node in iter_blocks(prompt):
        raw = node.raw
        text = raw.get("text") if isinstance(raw, dict) else None
        seen += len(text) if isinstance(text, str) else len(json.dumps(raw, default=str))
        if seen >= limit:
            return True
    return False


def _openai(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    if ctx.provider != "openai":
        return prompt, [Edit(NAME, False, "params", f"provider {ctx.provider!r}: automatic "
                             "prefix caching, nothing to place")]
    if not _chars_reach(prompt, OPENAI_MIN_PROMPT_TOKENS):
        return prompt, [Edit(NAME, False, "params", "prompt below OpenAI's minimum cacheable "
                             f"length of {OPENAI_MIN_PROMPT_TOKENS} tokens: nothing to key")]
    s = ctx.settings
    done: list[str] = []
    if s.openai_prompt_cache_key:
        if "prompt_cache_key" in prompt.params:
            done.append("client prompt_cache_key kept")
        else:
            key = (conversation_key(s.tenant, ctx.session_id) if ctx.session_id
                   else f"{s.tenant}-{stable_prefix_hash(prompt)[:16]}")
            prompt = prompt.with_param("prompt_cache_key", key)
            done.append(f"prompt_cache_key={key}")
    if s.openai_prompt_cache_retention:
        if "prompt_cache_retention" in prompt.params:
            done.append("client prompt_cache_retention kept")
        else:
            prompt = prompt.with_param("prompt_cache_retention", s.openai_prompt_cache_retention)
            done.append(f"prompt_cache_retention={s.openai_prompt_cache_retention}")
    applied = any("=" in d for d in done)
    return prompt, [Edit(NAME, applied, "params", "; ".join(done) or "no cache params in policy")]


DIAGNOSTICS_MEMORY = "diagnostics"
"""Session-memory key of the session's previous answer id (``{"previous_id": "msg_..."}``),
written by the proxy after each answer of a route that asks for cache diagnostics."""


def _ask_diagnostics(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """With ``settings.cache_diagnostics`` on an Anthropic route: ``diagnostics:
    {"previous_message_id": <the session's previous answer id, null on its first request>}``
    (https://platform.claude.com/docs/en/build-with-claude/cache-diagnostics; the proxy adds the
    beta header). A client's own ``diagnostics`` is kept. Request metadata: the model never
    reads it."""
    if not ctx.settings.cache_diagnostics:
        return prompt, []
    if "diagnostics" in prompt.params:
        return prompt, [Edit(NAME, False, "params", "client diagnostics kept")]
    mem = ctx.session.get(DIAGNOSTICS_MEMORY)
    prev = mem.get("previous_id") if isinstance(mem, dict) else None
    prev = prev if isinstance(prev, str) and prev else None
    prompt = prompt.with_param("diagnostics", {"previous_message_id": prev})
    return prompt, [Edit(NAME, True, "params", "diagnostics.previous_message_id="
                         + ("null (first request)" if prev is None else "the previous answer"))]


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Plan breakpoints (Anthropic, ``ctx.provider == "anthropic"``) or OpenAI cache params;
    on Anthropic routes that ask for it, the cache-diagnostics request (:func:`_ask_diagnostics`)."""
    if prompt.api == "openai" or ctx.provider == "openai":  # an Anthropic client bridged to
        return _openai(prompt, ctx)                          # OpenAI: the key travels over it
    if ctx.provider != "anthropic":
        return prompt, [Edit(NAME, False, "messages", f"provider {ctx.provider!r} has no explicit "
                             "breakpoints")]
    prompt, asked = _ask_diagnostics(prompt, ctx)
    out, edits = _anthropic(prompt, ctx)
    return out, [*edits, *asked]
