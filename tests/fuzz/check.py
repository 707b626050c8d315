"""One fuzz case end to end: build the body, send it through the proxy, check every invariant.

:func:`make_case` builds the seeded body for one of :data:`PATHS`; :func:`check_exchange`
returns every :class:`~tests.fuzz.meaning.Violation` of what the proxy did with it:

* ``status_5xx`` — the proxy answered 5xx (the upstream never fails here);
* ``error_*`` — a 4xx not in the caller's shape, or a 400 naming no param (a JSON syntax
  error has none to name);
* ``answer_*`` / ``stream_*`` — a 200 not in the caller's shape;
  ``answer_number_text_changed`` — the upstream's tool-call numbers (an integer beyond 64 bits,
  ``1.10``) did not reach the client byte for byte;
* ``upstream_not_json`` / ``upstream_invalid:<kind>`` — the upstream got a body its API rejects
  (for a hostile client body, only problems the client's own body did not have);
* the meaning checker's kinds (:mod:`tests.fuzz.meaning`), ``tool_dropped`` /
  ``required_tool_dropped``, ``number_text_changed``, ``field_dropped`` (bridges);
* ``edits_*`` / ``ledger_*`` — records that do not match what happened;
* ``pass_below_min_cacheable`` — hoist_volatile added tokens to a prompt certainly below the
  backend's minimum cacheable length (it cannot pay).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prefixgate.config.cache_rules import DEFAULT_MIN_CACHEABLE_TOKENS, OPENAI_MIN_PROMPT_TOKENS
from tests.fuzz.answers import ANSWER_NUMBERS, answer_tool
from tests.fuzz.fields import field_violations
from tests.fuzz.gen_anthropic import anthropic_body
from tests.fuzz.gen_openai import openai_body
from tests.fuzz.harness import REWRITE_ALL_ON as RW
from tests.fuzz.harness import Exchange
from tests.fuzz.jsontext import dumps, loads, number_literals
from tests.fuzz.meaning import Allow, Violation, meaning_violations
from tests.fuzz.shapes import answer_problems, error_problems, request_problems
from tests.fuzz.transcript import transcript

# (client api, model): see tests/fuzz/harness.py for the backend each model routes to
PATHS: tuple[tuple[str, str], ...] = (
    ("openai", "gpt-fuzz"), ("openai", "gpt-4o-fuzz"), ("anthropic", "claude-fuzz"),
    ("anthropic", "gpt-fuzz"), ("openai", "claude-fuzz"),
)
PRUNERS = ("prune_tools", "prune_rag", "prune_history")
HOSTILE_HEADERS: tuple[tuple[str, bytes], ...] = (
    ("user-agent", "fuzz-agent/1.0 (caf\u00e9)".encode()), ("x-stainless-os", "Linux\u00e9".encode()),
    ("anthropic-beta", "prompt-caching-2024-07-31,\u00e9".encode()), ("x-request-id", b"req-\xff\xfe"),
    ("user-agent", b"a" * 8000),
)


def backend_api(model: str) -> str:
    """The API the upstream for ``model`` speaks (the fuzz policy's routes)."""
    return "anthropic" if model.startswith("claude-") else "openai"


def path_name(api: str, model: str) -> str:
    """``"openai->openai"``, ``"anthropic->openai"`` ...: client API -> backend API."""
    return f"{api}->{backend_api(model)}"


@dataclass
class Case:
    """One generated request: ``api`` of the client, ``model``, ``body`` (with exact number
    literals), its ``raw`` bytes, and whether it is ``valid`` for its API."""

    api: str
    model: str
    body: dict[str, Any]
    raw: bytes
    valid: bool
    session: str
    headers: dict[str, bytes] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return path_name(self.api, self.model)


def make_case(seed: int, path: int) -> Case:
    """The body for ``seed`` on ``PATHS[path]``; the same arguments give the same bytes."""
    r = random.Random(seed)
    api, model = PATHS[path % len(PATHS)]
    body, valid = (anthropic_body if api == "anthropic" else openai_body)(r, model)
    raw = dumps(body, ascii_only=r.random() < 0.2)
    headers = {}
    if r.random() < 0.04:  # what SDKs and agents really send, with a byte HTTP allows but ASCII does not
        name, value = r.choice(HOSTILE_HEADERS)
        headers[name] = value
    return Case(api, model, body, raw, valid, f"s{seed % 13}", headers)


def applied_passes(summary: str) -> set[str]:
    """Pass names the ``x-prefixgate-edits`` summary says applied (``!name`` = reverted;
    ``none`` / ``off`` / ``unavailable`` / ``over_budget``: the body went as the client sent it,
    no pass)."""
    names = set()
    for item in summary.split(";"):
        if item and not item.startswith("!") and item not in ("none", "off", "unavailable", "over_budget"):
            names.add(re.split(r"[:-]", item, maxsplit=1)[0])
    return names


def _tool_names(body: dict[str, Any], api: str) -> list[str]:
    tools = body.get("tools")
    names = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict):
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names


def _required_tools(body: dict[str, Any], client_msgs: list[Any]) -> set[str]:
    """Tools pruning must keep: called in the history, named by tool_choice (allowed_tools
    included), pinned by the policy, or named by an "Always call X" system line."""
    need = set(RW["pinned_tools"])
    for m in client_msgs:
        need |= {u.key[2] for u in m.units if hasattr(u, "key") and u.key[0] == "call"
                 and isinstance(u.key[2], str)}
        if m.role == "system":
            for u in m.units:
                need |= set(re.findall(r"Always call (\w+)", getattr(u, "text", "")))
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        if isinstance(fn.get("name"), str):
            need.add(fn["name"])
        allowed = tc.get("allowed_tools")
        for t in allowed.get("tools", []) if isinstance(allowed, dict) else []:
            f = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else {}
            if isinstance(f.get("name"), str):
                need.add(f["name"])
    return need


_SAME_KIND = {**dict.fromkeys(("orphan_tool_result", "unanswered_tool_call", "tool_pairing",
                               "tool_result_not_first"), "tool_pairing"),
              **dict.fromkeys(("bad_text", "empty_or_bad_text", "bad_content", "empty_content",
                               "missing_content", "bad_part", "bad_block"), "bad_content")}


def _problem_kind(problem: str) -> str:
    """A problem's kind, the same in both APIs (tool pairing and content rules differ in form
    only between them)."""
    kind = problem.split(":")[0]
    return _SAME_KIND.get(kind, kind)


MIN_CACHEABLE = min(DEFAULT_MIN_CACHEABLE_TOKENS, OPENAI_MIN_PROMPT_TOKENS)


def _surely_below_min_cacheable(case: Case, client: dict[str, Any], msgs: list[Any]) -> bool:
    """True when the prompt is certainly shorter than the backend's minimum cacheable length
    (prefixgate/config/cache_rules.py: 1024 tokens for Anthropic's default and OpenAI): under 1024
    characters of text and tool definitions, no media (a token is at least one character).
    Radix backends have no minimum: never True for them."""
    if not (case.model.startswith("claude-") or case.model.startswith("gpt-4o")):
        return False
    if any(getattr(u, "key", ("",))[0] in ("media", "opaque") for m in msgs for u in m.units):
        return False
    chars = sum(len(u.text) for m in msgs for u in m.units if hasattr(u, "text"))
    chars += len(dumps(client.get("tools") or []))
    return chars < MIN_CACHEABLE


def _json_or_none(raw: bytes) -> Any:
    try:
        return loads(raw)
    except (ValueError, RecursionError):
        return None


def _error_checks(case: Case, ex: Exchange) -> list[Violation]:
    try:
        err = loads(ex.body)
    except ValueError:
        err = None
    if ex.status == 400 and b"could not parse the JSON" in ex.body:
        # JSON the proxy's parser refuses (a lone surrogate escape, 1e400): RFC 8259 lets a
        # parser limit these; the answer names no param because there is none
        return [Violation(p, f"{ex.status}") for p in error_problems(ex.status, err, case.api)
                if p != "error_names_no_param"]
    return [Violation(p, f"{ex.status}: {ex.body[:160]!r}") for p in error_problems(ex.status, err, case.api)]


def check_exchange(case: Case, ex: Exchange, ledger_row: tuple[int, int] | None = None) -> list[Violation]:
    """Every invariant ``ex`` breaks (see module docstring). ``ledger_row``: (rows written for
    this request, its http_status), when the caller read the ledger."""
    out: list[Violation] = []
    if ledger_row is not None and ledger_row != (1, ex.status):
        out.append(Violation("ledger_mismatch", f"ledger rows/http_status {ledger_row} for answer {ex.status}"
                             + (f": {ex.body[:160]!r}" if ex.status >= 400 else "")))
    if ex.status >= 500:
        return out + [Violation("status_5xx", f"{ex.status}: {ex.body[:200]!r}")]
    if ex.status >= 400:
        return out + _error_checks(case, ex)
    stream = case.body.get("stream") is True
    out += [Violation(p, ex.body[:160].decode("utf-8", "replace"))
            for p in answer_problems(ex.body, ex.headers.get("content-type", ""), case.api, stream)]
    if len(ex.sent) != 1:
        return out + [Violation("upstream_requests", f"{len(ex.sent)} upstream requests for one")]
    if answer_tool(_json_or_none(ex.sent[0].body)):  # the upstream answered with a tool call
        lost = [n for n in ANSWER_NUMBERS if n.encode() not in ex.body]
        if lost:
            out.append(Violation("answer_number_text_changed", f"the upstream's tool call numbers {lost} "
                                 f"reached the client as {ex.body[:300]!r}"))
    sent = ex.sent[0]
    try:
        client = loads(case.raw)
        up = loads(sent.body)
    except RecursionError:
        return out  # nesting deeper than this checker parses: status and shape checked above
    except ValueError as e:
        return out + [Violation("upstream_not_json", str(e)[:120])]
    b_api = backend_api(case.model)
    probs = Counter(_problem_kind(p) for p in request_problems(up, b_api))
    if not case.valid:
        probs -= Counter(_problem_kind(p) for p in request_problems(client, case.api))
    out += [Violation("upstream_invalid:" + p, p) for p in sorted(probs)]
    summary = ex.headers.get("x-prefixgate-edits", "")
    passes = applied_passes(summary)
    allow = Allow(rag="prune_rag" in passes, history="prune_history" in passes,
                  hoist="hoist_volatile" in passes, delimiters=tuple(RW["rag_delimiters"]))
    c_msgs, u_msgs = transcript(client, case.api), transcript(up, b_api)
    out += meaning_violations(c_msgs, u_msgs, allow)
    if "hoist_volatile" in passes and _surely_below_min_cacheable(case, client, c_msgs):
        out.append(Violation("pass_below_min_cacheable", f"hoist_volatile applied to a prompt under "
                             f"{MIN_CACHEABLE} tokens ({case.path}, model {case.model})"))
    have_tools = set(_tool_names(up, b_api))
    want = _tool_names(client, case.api)
    if "prune_tools" in passes:
        lost = sorted((_required_tools(client, c_msgs) & set(want)) - have_tools)
        out += [Violation("required_tool_dropped", f"{n!r}") for n in lost]
    else:
        out += [Violation("tool_dropped", f"{n!r}") for n in sorted(set(want) - have_tools)]
    if b_api == case.api:
        if not passes & set(PRUNERS):
            lost_n = number_literals(client, frozenset({"arguments"})) - number_literals(
                up, frozenset({"arguments"}))
            if lost_n:
                out.append(Violation("number_text_changed", f"{sorted(lost_n)[:4]} did not arrive as sent"))
        if sent.body == case.raw and passes:
            out.append(Violation("edits_listed_for_unchanged_body", summary))
        if sent.body != case.raw and not passes:
            out.append(Violation("body_changed_without_edit", summary))
    else:
        out += field_violations(client, up, case.api)
    return out
