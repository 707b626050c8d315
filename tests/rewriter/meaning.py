"""The *Meaning kept* and *Validity* invariants as one plain function: :func:`check_meaning`.

DESIGN.md ("Invariants"), issue 8: with every pass on, the upstream receives every user-authored
character and every tool call and result of the client's request, in order — except what a
pruning pass may remove: retrieved passages (documents, search results, tool results) and old
turns, only above the budget; never the first user turn, never the user's own text. And at most 4
``cache_control`` breakpoints, counted wherever the API allows them.

The checker reads the wire bodies itself (it does not use the rewriter's IR, so an IR bug cannot
hide from it) and works across APIs: the client body may be Chat Completions and the upstream
body Messages (or the other way), as a bridge sends it. Both bodies are flattened into *atoms* in
request order — user text, assistant text, tool calls, tool results, media / document blocks,
system text — and every client atom must be found in the upstream atoms, in order:

* text atoms match when the upstream text *contains* the client text (additions such as a
  hoisted note or a bridge's separators are allowed; several client blocks may land in one
  upstream string, in order);
* tool calls match on id, name and canonical arguments (``"{\\"a\\":1}"`` == ``{"a": 1}``);
* tool results match on id and on content text.

Allowed reorders, only when ``settings.stabilise_passages`` is on (nothing removed): a user text
or tool result may carry its recognised retrieval (:func:`prefixgate.rewriter.analysis.passage_forms.find_retrieval`)
with the passages permuted — every passage whole, the text outside them unchanged; a run of
``document`` / ``search_result`` blocks may be permuted.

Allowed differences, only when ``settings`` says the pass was on and the request was over its
budget (token counts with :func:`prefixgate.rewriter.analysis.tokens.json_tokens`, media at a fixed cost, plus
:data:`FRAMING_TOKENS` per message and per content unit for the history):

* ``prune_history`` over ``history_high_watermark_tokens``: atoms of messages after the first
  user turn and before the newest user message may be missing; a tool result may be replaced by
  prefixgate's elision note.
* ``prune_rag``: a tool result whose text exceeds ``rag_budget_tokens`` may lose whole lines;
  a user text may lose chunks tagged as injected retrieval (its text outside them unchanged);
  document / search_result blocks may be missing when their run exceeds the budget.

System text may move (``hoist_volatile`` moves a clock to a note at the end), so it is checked as
a multiset of words: every word of the client's system text occurs at least as often in the
upstream body's text.

Limits: ``document`` / ``search_result`` blocks are compared as blocks, so a bridge that carries
them as delimited text needs its own mapping before this check.

Use from a test or a fuzzer::

    from tests.rewriter.meaning import check_meaning
    check_meaning(client_body, upstream_body, "openai", "anthropic", settings=policy.rewrite)

Raises :class:`MeaningViolation` (an ``AssertionError``) listing every problem found.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefixgate.config.schema import RewriteSettings, switch_on
from prefixgate.rewriter.analysis.passage_forms import find_retrieval
from prefixgate.rewriter.analysis.passages import find_passages
from prefixgate.rewriter.analysis.tokens import TokenCounter, count_tokens, json_tokens

MAX_BREAKPOINTS = 4
ELISION_PREFIX = "[prefixgate: the earlier result of "
FRAMING_TOKENS = 16
"""Tolerance per message and per content unit when deciding whether a history was over the
watermark: a pass may count framing (role, block wrappers) the wire JSON does not spell out."""
_WORDS = re.compile(r"\w+")


class MeaningViolation(AssertionError):
    """The upstream body lost or reordered client content, or breaks a validity rule.

    ``problems``: one line per finding (what, where)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems[:10]))
        self.problems = problems


@dataclass(frozen=True)
class Atom:
    """One unit of client content: ``kind`` (``user_text``, ``assistant_text``, ``tool_call``,
    ``tool_result``, ``media``, ``passage``), ``key`` (call id, or canonical JSON of a media
    block), ``text`` (text or canonical arguments), ``msg`` (message index)."""

    kind: str
    key: str
    text: str
    msg: int


def _canon(value: Any) -> str:
    """Canonical JSON of a value (a JSON string is parsed first; ``cache_control`` removed)."""
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return text
    return json.dumps(_strip_cc(value), sort_keys=True, ensure_ascii=False)


def _strip_cc(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cc(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cc(v) for v in value]
    return value


def _content_text(content: Any) -> str:
    """A tool result's / message's content as text: strings and text parts joined by newlines,
    other parts as canonical JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(c["text"] if isinstance(c, dict) and isinstance(c.get("text"), str)
                         else _canon(c) for c in content)
    return _canon(content)


def _media_key(block: dict[str, Any]) -> str:
    """What identifies a media block across APIs: an image's base64 data or URL (an Anthropic
    ``source`` and an OpenAI ``image_url`` data URL of the same bytes give the same key), else
    the block's canonical JSON."""
    src = block.get("source")
    if isinstance(src, dict) and isinstance(src.get("data") or src.get("url"), str):
        return "media:" + str(src.get("data") or src.get("url"))
    img = block.get("image_url")
    url = img.get("url") if isinstance(img, dict) else img
    if isinstance(url, str):
        return "media:" + (url.split(",", 1)[1] if url.startswith("data:") else url)
    return _canon(block)


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _block_atoms(role: str, block: dict[str, Any], mi: int) -> Iterator[Atom]:
    kind = block.get("type")
    if isinstance(block.get("text"), str) and kind in ("text", "input_text", "output_text"):
        yield Atom("user_text" if role == "user" else "assistant_text", "", block["text"], mi)
    elif kind == "tool_use":
        yield Atom("tool_call", str(block.get("id")), f'{block.get("name")}:'
                   f'{_canon(block.get("input"))}', mi)
    elif kind == "tool_result":
        yield Atom("tool_result", str(block.get("tool_use_id")),
                   _content_text(block.get("content")), mi)
    elif kind in ("document", "search_result"):
        yield Atom("passage", _canon(block), "", mi)
    elif kind not in ("thinking", "redacted_thinking", "text"):
        yield Atom("media", _media_key(block), "", mi)


def atoms(body: dict[str, Any], api: str) -> tuple[list[Atom], list[str]]:
    """``(message atoms in order, system texts)`` of a Chat Completions (``api="openai"``) or
    Messages (``api="anthropic"``) body."""
    out: list[Atom] = []
    system: list[str] = []
    if api == "anthropic":
        system.extend(b["text"] for b in _blocks(body.get("system"))
                      if isinstance(b.get("text"), str))
    for mi, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        role = str(m.get("role"))
        if role in ("system", "developer"):
            system.append(_content_text(m.get("content")))
            continue
        if role in ("tool", "function"):
            key = str(m.get("tool_call_id") or m.get("name"))
            out.append(Atom("tool_result", key, _content_text(m.get("content")), mi))
            continue
        for b in _blocks(m.get("content")):
            out.extend(_block_atoms(role, b, mi))
        calls = m.get("tool_calls") or []
        legacy = m.get("function_call")
        for c in [*calls, *([{"id": legacy.get("name"), "function": legacy}]
                            if isinstance(legacy, dict) else [])]:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict):
                out.append(Atom("tool_call", str(c.get("id")),
                                f'{fn.get("name")}:{_canon(fn.get("arguments"))}', mi))
    return out, system


def count_breakpoints(body: dict[str, Any]) -> int:
    """Every ``cache_control`` dict in a body, wherever it sits (tools, system, message blocks,
    blocks nested at any depth), a top-level one included; tool inputs / arguments are data and
    are not looked into."""
    def walk(v: Any, key: str) -> int:
        if key in ("input", "arguments"):
            return 0
        if isinstance(v, dict):
            own = 1 if isinstance(v.get("cache_control"), dict) else 0
            return own + sum(walk(x, k) for k, x in v.items() if k != "cache_control")
        if isinstance(v, list):
            return sum(walk(x, "") for x in v)
        return 0
    return walk(body, "")


def _passages_only_removed(client: str, sent: str, retrieved: bool,
                           delimiters: list[str]) -> bool:
    """True when ``sent`` is ``client`` with whole passages removed (and the kept ones possibly
    reordered): the same text outside the client's passages (whitespace aside)."""
    ps = find_passages(client, delimiters, retrieved=retrieved)
    if not ps:
        return False
    chunks = sorted({client[p.start:p.end] for p in ps}, key=len, reverse=True)
    return _outside(client, chunks, delimiters) == _outside(sent, chunks, delimiters)


def _outside(text: str, chunks: list[str], delimiters: list[str]) -> str:
    """``text`` without any of the passage ``chunks``, delimiters or whitespace: what must be
    equal between a client text and its pruned form."""
    for c in chunks:
        text = text.replace(c, "")
    for d in delimiters:
        if d.strip():
            text = text.replace(d.strip(), "")
    return "".join(text.split())


def _passages_permuted(client: str, sent: str, origin: str) -> bool:
    """True when ``sent`` is ``client`` with the passages of its retrieval permuted: same
    length, every passage present as often, the same text outside them (whitespace aside)."""
    ps = find_retrieval(client, origin)  # type: ignore[arg-type]
    if not ps or len(client) != len(sent):
        return False
    chunks = sorted({client[p.start:p.end] for p in ps}, key=len, reverse=True)
    return all(sent.count(c) >= client.count(c) for c in chunks) and \
        _outside(client, chunks, []) == _outside(sent, chunks, [])


def _sorted_runs(xs: list[Atom]) -> list[Atom]:
    """``xs`` with each run of consecutive passage atoms of one message sorted by key."""
    out: list[Atom] = []
    i = 0
    while i < len(xs):
        j = i
        while j < len(xs) and xs[j].kind == "passage" and xs[j].msg == xs[i].msg:
            j += 1
        if j > i:
            out.extend(sorted(xs[i:j], key=lambda a: a.key))
            i = j
        else:
            out.append(xs[i])
            i += 1
    return out


def _result_ok(client: str, sent: str, history: bool, rag: RewriteSettings | None,
               count: TokenCounter, stable: bool = False) -> bool:
    if client == sent or client in sent:
        return True
    if stable and (_passages_permuted(client, sent, "tool") or (
            '"search_result"' in client
            and sorted(client.splitlines()) == sorted(sent.splitlines()))):
        return True
    if history and sent.startswith(ELISION_PREFIX):
        return True
    if rag is not None and count(client) > rag.rag_budget_tokens:
        lines = set(client.splitlines())
        return all(line in lines for line in sent.splitlines()) or _passages_only_removed(
            client, sent, True, list(rag.rag_delimiters))
    return False


def check_meaning(client: dict[str, Any], upstream: dict[str, Any], api: str,
                  upstream_api: str | None = None, *, settings: RewriteSettings | None = None,
                  count: TokenCounter = count_tokens) -> None:
    """Assert that ``upstream`` (the body sent to the backend, API ``upstream_api``, default
    ``api``) keeps the meaning of ``client`` (the body the client sent, API ``api``): see the
    module docstring for the rules and the allowed removals. ``settings``: the rewrite policy
    in force (``None``: nothing may be removed). ``count``: text -> tokens.

    Raises :class:`MeaningViolation` listing every problem; returns ``None`` when all hold.
    """
    up_api = upstream_api or api
    c_atoms, c_sys = atoms(client, api)
    u_atoms, u_sys = atoms(upstream, up_api)
    problems: list[str] = []
    s = settings
    stable = bool(s and s.enabled and switch_on(s, "stabilise_passages"))
    if stable:
        c_atoms, u_atoms = _sorted_runs(c_atoms), _sorted_runs(u_atoms)
    msgs = client.get("messages") or []
    framing = FRAMING_TOKENS * (len(msgs) + len(c_atoms))
    over_history = bool(s and s.enabled and switch_on(s, "prune_history") and json_tokens(msgs, count)
                        + framing > s.history_high_watermark_tokens)
    rag = bool(s and s.enabled and switch_on(s, "prune_rag"))
    rag_budget = s.rag_budget_tokens if s and rag else None
    user_idx = sorted({a.msg for a in c_atoms if a.kind in ("user_text", "media", "passage")
                       and isinstance(msgs[a.msg], dict) and msgs[a.msg].get("role") == "user"})
    first_user, last_user = (user_idx[0], user_idx[-1]) if user_idx else (-1, -1)
    doc_tokens = Counter[int]()
    for a in c_atoms:
        if a.kind == "passage":
            doc_tokens[a.msg] += json_tokens(json.loads(a.key), count)

    def next_match(a: Atom, j: int, off: int) -> tuple[int, int] | None:
        """Earliest upstream position matching ``a`` from ``(j, off)``: the state after it."""
        for k in range(j, len(u_atoms)):
            u = u_atoms[k]
            if u.kind != a.kind:
                continue
            start = off if k == j else 0
            if a.kind.endswith("_text"):
                hit = u.text.find(a.text, start)
                if hit >= 0:
                    return k, hit + len(a.text)
                if rag and a.kind == "user_text" and start == 0 \
                        and _passages_only_removed(a.text, u.text, False, []):
                    return k, len(u.text)
                if stable and a.kind == "user_text" and start == 0 \
                        and _passages_permuted(a.text, u.text, "user"):
                    return k, len(u.text)
            elif u.key == a.key and (a.kind != "tool_call" or u.text == a.text) and (
                    a.kind != "tool_result"
                    or _result_ok(a.text, u.text, over_history, s if rag else None, count,
                                  stable)):
                return k + 1, 0
        return None

    def droppable(a: Atom) -> bool:
        turn = over_history and first_user < a.msg < last_user
        doc = a.kind == "passage" and rag_budget is not None and doc_tokens[a.msg] > rag_budget
        return turn or doc

    # Subsequence embedding with optional atoms: the earliest match is always best for a
    # matched atom, so only "skip or match" branches; states are (upstream index, offset).
    states: set[tuple[int, int]] = {(0, 0)}
    for a in c_atoms:
        new: set[tuple[int, int]] = set()
        skip = droppable(a)
        for j, off in states:
            if skip:
                new.add((j, off))
            hit = next_match(a, j, off)
            if hit is not None:
                new.add(hit)
        if not new:
            problems.append(f"{a.kind} of client message {a.msg} missing or out of order"
                            + (f" (id {a.key})" if a.kind.startswith("tool") else ""))
            continue
        states = new

    u_words = Counter(_WORDS.findall("\n".join([*u_sys, *(x.text for x in u_atoms)])))
    missing = Counter(_WORDS.findall("\n".join(c_sys))) - u_words
    if missing:
        problems.append(f"system text lost {sum(missing.values())} word(s), e.g. "
                        f"{sorted(missing)[:3]}")
    n = count_breakpoints(upstream)
    if n > MAX_BREAKPOINTS and n > count_breakpoints(client):
        problems.append(f"{n} cache_control breakpoints sent (limit {MAX_BREAKPOINTS})")
    if problems:
        raise MeaningViolation(problems)
