"""Small helpers shared by the rewriter tests."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from prefixgate.config.schema import MOVES_THE_MODEL_READS, RewriteSettings
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context, RewriteResult
from prefixgate.rewriter.wire.ir import Api

OPT_IN_MOVES = {name: True for name in MOVES_THE_MODEL_READS}
"""The rewriter tests exercise every pass, the opt-in ones that move text included (a test
passes ``hoist_volatile=False`` to see a pass alone); what is on by default is pinned by
``tests/config/test_rewrite_defaults.py``."""


def ctx(provider: str = "radix", session: dict[str, Any] | None = None,
        betas: tuple[str, ...] = (), model: str = "", **settings: Any) -> Context:
    """A Context with ``RewriteSettings(**OPT_IN_MOVES, **settings)`` and a read-only session
    copy."""
    return Context(RewriteSettings(**{**OPT_IN_MOVES, **settings}), model=model, provider=provider,
                   session=MappingProxyType(dict(session or {})), betas=betas)


def replay(bodies: list[dict[str, Any]], api: Api, provider: str = "radix", model: str = "",
           **settings: Any) -> list[RewriteResult]:
    """Rewrite a session's requests in order, merging each result's memory like the proxy."""
    memory: dict[str, Any] = {}
    out = []
    for body in bodies:
        r = rewrite_request(body, api, ctx(provider, memory, model=model, **settings))
        memory.update(session_updates(r))
        out.append(r)
    return out


NOTE_STARTS = ("<system-reminder>", "(Current values")


def is_note(text: str) -> bool:
    """True for the text of a hoisted note on its own (a block or a message of its own; after
    a text block it starts with a blank line)."""
    return text.lstrip("\n").startswith(NOTE_STARTS)


def note_free(text: str) -> str:
    """``text`` without a hoisted note joined to it after a blank line (``last_user`` /
    ``reminder`` on a one-string user message); ``""`` for a note on its own."""
    if is_note(text):
        return ""
    for start in NOTE_STARTS:
        text = text.split("\n\n" + start)[0]
    return text


def clock_session(make: Any, values: list[str], api: Api, provider: str = "radix",
                  model: str = "", **settings: Any) -> list[RewriteResult]:
    """:func:`replay` of ``make(value)`` for each clock value in turn: a session whose clock
    changes between requests (so it is seen changing from the second one on)."""
    return replay([make(v) for v in values], api, provider, model, **settings)
