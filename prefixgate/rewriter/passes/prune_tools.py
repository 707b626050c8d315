"""Pass: send only the tools the conversation can use, and keep that set byte-stable.

Rule. Tool definitions are the first thing in the cached prefix and often its largest part (the
GitHub MCP server alone is 117 tools). A catalog of ``settings.prune_tools_min_catalog`` tools or
more is ranked against the conversation (:mod:`prefixgate.rewriter.analysis.tool_rank`, BM25) and
cut to a :class:`prefixgate.rewriter.analysis.tool_rank.KeepRule` selection. Always kept, whatever
their rank (case B06, BerriAI/litellm PR #34198, issue 8 class 3) — :func:`required_tools`:

* every tool called in the history (Anthropic ``tool_use``, OpenAI ``tool_calls`` and legacy
  ``function_call``, ``role: "function"`` messages);
* every tool named anywhere in ``tool_choice`` (or legacy ``function_call``), whatever its form:
  ``{"type":"function","function":{"name"}}``, Anthropic ``{"type":"tool","name"}``, OpenAI
  ``{"type":"allowed_tools","allowed_tools":{"tools":[...]}}`` and the Responses form;
* every tool whose name appears as a word in the system prompt or in any system / developer
  message ("always call audit_log first");
* ``settings.pinned_tools`` and server tools (``{"type": "web_search_20250305", ...}``),
* tools marked ``defer_loading: true`` (tool search loads them on demand, so they cost no
  prompt tokens until referenced, and a ``tool_reference`` may name them at any turn),

so a history's tool blocks never lose their definition, an instruction naming a tool can be
followed, and ``tools`` is never empty while tool blocks remain.

Sticky per session. A prefix cache is byte-exact, so a kept set that changed with every user turn
would miss on the whole prompt every turn. The kept set is remembered in session memory
(``Edit.memory["prune_tools"] = {"kept": [names]}``) and on later turns only *grows*: it is the
remembered set, plus tools the history calls, plus the top :data:`ADD_TOP` tools for the whole
conversation and their siblings (:func:`prefixgate.rewriter.analysis.tool_rank.siblings`), plus the
top tool for the newest user text alone (scores > 0). It is rebuilt from scratch only at a
compaction event (this request makes :mod:`prefixgate.rewriter.passes.prune_history` compact, so the
prefix is rebuilt anyway; judged on the history as this pass sees it, before RAG pruning). Kept
tools keep the canonical order the earlier passes gave the catalog. A client ``cache_control``
marker on a dropped tool moves to the nearest kept tool before it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache

from prefixgate.config.schema import switch_on
from prefixgate.rewriter.analysis.tool_rank import (
    KeepRule,
    ToolInfo,
    query_terms,
    rank_tools,
    select_tools,
    siblings,
)
from prefixgate.rewriter.types import Context, Edit
from prefixgate.rewriter.wire.ir import Message, Prompt, Tool, used_tool_names
from prefixgate.rewriter.wire.validate import tool_choice_names

NAME = "prune_tools"
MEMORY_KEY = "prune_tools"
ADD_TOP = 3
DEFAULT_RULE = KeepRule()


def conversation_texts(messages: Sequence[Message]) -> tuple[list[str], list[str]]:
    """``(user_texts, assistant_texts)`` oldest first: user text blocks (tool results and
    hoisted volatile notes excluded) and assistant prose."""
    users: list[str] = []
    others: list[str] = []
    for m in messages:
        text = "\n".join(b.text for b in m.blocks if b.is_text and not b.volatile)
        if not text.strip():
            continue
        if m.role == "user":
            users.append(text)
        elif m.role == "assistant":
            others.append(text)
    return users, others


def _is_server_tool(t: Tool) -> bool:
    kind = t.raw.get("type")
    return isinstance(kind, str) and kind not in ("function", "custom") and t.schema is None


_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]*")


def _instruction_words(prompt: Prompt) -> set[str]:
    """Words of the system prompt and of every system / developer message (trailing ``.:/-``
    stripped), to find tool names an instruction mentions; also of the blocks flagged
    ``volatile`` (hoist_volatile's note, which runs first and may have moved an instruction
    line such as "Always call X" out of the system prompt into the last user turn)."""
    words: set[str] = set()
    for m in (*prompt.system, *prompt.messages):
        instruction = m.role in ("system", "developer")
        for b in m.blocks:
            if not (instruction or b.volatile):
                continue
            for w in _WORD.findall(b.text):
                words.add(w)
                words.add(w.rstrip(".:/-"))
    return words


def required_tools(prompt: Prompt, ctx: Context) -> set[str]:
    """Names of the tools that must never be pruned (module docstring: history calls, any
    name in ``tool_choice`` / ``function_call``, names the system or developer text mentions,
    pinned, server and ``defer_loading`` tools). May hold names that are not defined; callers intersect."""
    req = used_tool_names(prompt) | set(ctx.settings.pinned_tools)
    for m in prompt.messages:
        legacy = m.raw.get("function_call")
        if isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
            req.add(legacy["name"])
        if m.role == "function" and isinstance(m.raw.get("name"), str):
            req.add(m.raw["name"])
    req.update(tool_choice_names(prompt))
    tools = prompt.tools or ()
    words = _instruction_words(prompt)
    req.update(t.name for t in tools if t.name in words)
    req.update(t.name for t in tools if _is_server_tool(t))
    req.update(t.name for t in tools if t.raw.get("defer_loading") is True)
    return req



def _compacting(prompt: Prompt, ctx: Context) -> bool:
    if not switch_on(ctx.settings, "prune_history"):
        return False
    from prefixgate.rewriter.passes.prune_history import will_compact

    return will_compact(prompt, ctx)


def choose(prompt: Prompt, ctx: Context, rule: KeepRule = DEFAULT_RULE) -> tuple[set[str], str]:
    """Names of the tools to keep and a note on how they were chosen (see module docstring).

    Requires ``prompt.tools``; returns every name when the conversation has no text to rank by.
    """
    tools = list(prompt.tools or ())
    users, others = conversation_texts(prompt.messages)
    required = required_tools(prompt, ctx)
    names = {t.name for t in tools}
    if not users and not others:
        return names, "no conversation text to rank by: all kept"
    infos = [ToolInfo(t.name, t.description, t.schema if isinstance(t.schema, dict) else {})
             for t in tools]
    prev = ctx.session.get(MEMORY_KEY)
    sticky = (
        {n for n in prev.get("kept", []) if isinstance(n, str)} & names
        if isinstance(prev, dict) and not _compacting(prompt, ctx) else set()
    )
    if not sticky:
        ranked = rank_tools(infos, query_terms(users, others))
        tokens = {t.name: _tool_tokens(json.dumps(t.raw, ensure_ascii=False), ctx.count_tokens)
                  for t in tools}
        return set(select_tools(infos, ranked, tokens, rule)) | (required & names), "ranked"
    ranked = rank_tools(infos, query_terms(users, others))
    top = [n for n, s in ranked[:ADD_TOP] if s > 0]
    latest = rank_tools(infos, query_terms(users[-1:])) if users else []
    fresh = set(top) | set(siblings(infos, top)) | {n for n, s in latest[:1] if s > 0}
    return sticky | fresh | (required & names), "sticky"


@lru_cache(maxsize=8192)
def _tool_tokens(tool_json: str, count: Callable[[str], int]) -> int:
    return count(tool_json)


def _move_markers(tools: Sequence[Tool], keep: set[str]) -> list[Tool]:
    out: list[Tool] = []
    pending = None
    for t in tools:
        if t.name in keep:
            out.append(t)
            continue
        if t.cache_control is not None:
            if out:
                out[-1] = out[-1].with_cache_control(out[-1].cache_control or t.cache_control)
            else:
                pending = t.cache_control
    if pending is not None and out and out[0].cache_control is None:
        out[0] = out[0].with_cache_control(pending)
    return out


def allowed_tools_choice(names: Sequence[str], client_choice: object) -> dict[str, object] | None:
    """OpenAI's ``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`` for ``names``
    (catalog order): mode ``required`` when the client's ``tool_choice`` was ``"required"``,
    ``auto`` when absent or ``"auto"``; None for any other choice (``"none"``, a named
    function, the client's own ``allowed_tools``), which already binds and is left as sent."""
    if client_choice not in (None, "auto", "required"):
        return None
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": "required" if client_choice == "required" else "auto",
        "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


def _mask(prompt: Prompt, tools: Sequence[Tool], keep: set[str], how: str,
          memory: Mapping[str, object]) -> tuple[Prompt, list[Edit]]:
    """Masking instead of removal (``ctx.masks_tools``): the tool list stays byte-identical,
    ``tool_choice`` becomes ``allowed_tools`` over the kept names; nothing is removed."""
    names = [t.name for t in tools if t.name in keep]
    choice = allowed_tools_choice(names, prompt.params.get("tool_choice"))
    if choice is None:
        return prompt, [Edit(NAME, False, "tools", f"{how}: tool_choice already binds; "
                             "tools kept for the engine's mask", memory=memory)]
    detail = (f"bm25 {how}: masked {len(tools) - len(names)} of {len(tools)} tools (kept in the "
              f"prompt, not callable: tool_choice allowed_tools over {len(names)})")
    return prompt.with_param("tool_choice", choice), [
        Edit(NAME, True, "params", detail, memory=memory)]


def run(prompt: Prompt, ctx: Context) -> tuple[Prompt, list[Edit]]:
    """Prune ``prompt.tools``; one Edit (``region="tools"``, tokens of the tools JSON)."""
    tools = prompt.tools
    if not tools:
        return prompt, [Edit(NAME, False, "tools", "no tools")]
    floor = ctx.settings.prune_tools_min_catalog
    if len(tools) < floor:
        return prompt, [Edit(NAME, False, "tools",
                             f"catalog of {len(tools)} tools is below the {floor}-tool minimum")]
    if any(not t.name for t in tools) or len({t.name for t in tools}) != len(tools):
        return prompt, [Edit(NAME, False, "tools", "a tool has no name or a duplicate name")]
    keep, how = choose(prompt, ctx)
    memory = {} if how.startswith("no conversation") else {MEMORY_KEY: {"kept": sorted(keep)}}
    if len(keep) >= len(tools):
        return prompt, [Edit(NAME, False, "tools", f"{how}: every tool kept", memory=memory)]
    if ctx.masks_tools and prompt.api == "openai":
        return _mask(prompt, tools, keep, how, memory)
    kept = _move_markers(tools, keep)
    before = ctx.count_tokens(json.dumps([t.raw for t in tools], ensure_ascii=False))
    after = ctx.count_tokens(json.dumps([t.raw for t in kept], ensure_ascii=False))
    required = len(required_tools(prompt, ctx) & keep)
    detail = (f"bm25 {how}: kept {len(kept)} of {len(tools)} tools ({required} required: "
              f"called in history, tool_choice, pinned or server tools)")
    return replace(prompt, tools=tuple(kept)), [
        Edit(NAME, True, "tools", detail, before, after, memory=memory)]

