"""The rewrite step of a request: session identity, the pipeline call, the opt-out, fail-open.

- Session id: the client's ``x-prefixgate-session`` header, else
  ``sha256(key hash | first system text hash | first user message hash)`` — stable for one
  agent conversation, different across users (the proxy-facing key is hashed, never stored).
  Digits in the system text are masked before hashing, so a clock or request id in the system
  prompt (case B03) does not start a new session every minute.
- ``x-prefixgate-rewrite: off`` (or ``false`` / ``0``) turns rewriting off for that request;
  so does ``policy.rewrite.enabled: false``.
- The pipeline is :func:`rewriter.pipeline.rewrite_request` (injectable for tests). If it raises,
  the client's body is forwarded unchanged (fail-open) and the failure is logged and reported as
  the edit summary ``rewrite_failed``.
- The upstream bytes: when the body came back unchanged, the client's ORIGINAL bytes are sent
  (lossless by default, no re-serialization of large bodies, B19); otherwise
  :func:`proxy.exactjson.dumps` (orjson: key order and every number's text kept).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from config.schema import RewriteSettings
from proxy import exactjson
from rewriter.types import Api, Context, Edit, RewriteResult

log = logging.getLogger("prefixgate.rewrite")

RewriteFn = Callable[[dict[str, Any], Api, Context], RewriteResult]

SESSION_HEADER = "x-prefixgate-session"
_DIGITS = re.compile(r"[0-9]")
OPT_OUT_HEADER = "x-prefixgate-rewrite"


def default_rewrite_fn() -> RewriteFn | None:
    """The rewriter's pipeline, or None when the rewriter package has no pipeline yet."""
    try:
        from rewriter.pipeline import rewrite_request
    except ImportError:
        log.warning("rewriter.pipeline not available: requests are forwarded unchanged")
        return None
    return rewrite_request


def _h(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def session_id_for(headers: Mapping[str, str], body: dict[str, Any]) -> str:
    """The session id (see module docstring). Works for both APIs' bodies."""
    explicit = headers.get(SESSION_HEADER)
    if explicit:
        return explicit
    key = headers.get("authorization") or headers.get("x-api-key") or ""
    msgs: list[Any] = body["messages"] if isinstance(body.get("messages"), list) else []
    system = _text_of(body.get("system"))
    if not system:
        system = next((_text_of(m.get("content")) for m in msgs
                       if isinstance(m, dict) and m.get("role") in ("system", "developer")), "")
    first_user = next((_text_of(m.get("content")) for m in msgs
                       if isinstance(m, dict) and m.get("role") == "user"), "")
    system = _DIGITS.sub("0", system)
    return "auto-" + _h("|".join((_h(key), _h(system), _h(first_user))))


def session_hash(session_id: str) -> str:
    """What the ledger stores instead of the session id."""
    return _h("session:" + session_id)


def rewrite_wanted(headers: Mapping[str, str], settings: RewriteSettings) -> bool:
    """False when the policy disables rewriting or the client opted out by header."""
    if headers.get(OPT_OUT_HEADER, "").strip().lower() in ("off", "false", "0", "no"):
        return False
    return settings.enabled


@dataclass
class RewriteOutcome:
    """What the rewrite step produced: ``body`` (dict sent upstream), ``raw`` (its bytes),
    ``summary`` (header / ledger text), ``pruned`` (tokens removed), ``memory`` (merged
    session-memory updates), ``applied`` (whether any pass changed the body)."""

    body: dict[str, Any]
    raw: bytes
    summary: str
    pruned: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    applied: bool = False
    edits: list[Edit] = field(default_factory=list)


def _dumps(body: dict[str, Any]) -> bytes:
    return exactjson.dumps(body)  # numbers in their original text (issue 8, class 5)


def run_rewrite(fn: RewriteFn | None, body: dict[str, Any], raw: bytes, api: Api,
                ctx: Context | None) -> RewriteOutcome:
    """Apply ``fn`` (None or ``ctx`` None = rewriting off) and serialize. Never raises."""
    if fn is None or ctx is None:
        return RewriteOutcome(body, raw, "off" if ctx is None else "unavailable")
    try:
        result = fn(body, api, ctx)
    except Exception:  # fail-open: the client's request still goes through
        log.exception("rewrite pipeline failed; forwarding the original body")
        return RewriteOutcome(body, raw, "rewrite_failed")
    memory: dict[str, Any] = {}
    for e in result.edits:
        memory.update(e.memory)
    summary = result.summary() or "none"
    pruned = sum(e.tokens_removed for e in result.edits if e.applied)
    if result.body is body or result.body == body:
        return RewriteOutcome(body, raw, summary, pruned, memory, False, result.edits)
    return RewriteOutcome(result.body, _dumps(result.body), summary, pruned, memory, True,
                          result.edits)
