"""Small helpers shared by the rewriter tests."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from prefixgate.config.schema import RewriteSettings
from prefixgate.rewriter.ir import Api
from prefixgate.rewriter.pipeline import rewrite_request, session_updates
from prefixgate.rewriter.types import Context, RewriteResult


def ctx(provider: str = "radix", session: dict[str, Any] | None = None,
        betas: tuple[str, ...] = (), model: str = "", **settings: Any) -> Context:
    """A Context with ``RewriteSettings(**settings)`` and a read-only session copy."""
    return Context(RewriteSettings(**settings), model=model, provider=provider,
                   session=MappingProxyType(dict(session or {})), betas=betas)


def replay(bodies: list[dict[str, Any]], api: Api, provider: str = "radix",
           **settings: Any) -> list[RewriteResult]:
    """Rewrite a session's requests in order, merging each result's memory like the proxy."""
    memory: dict[str, Any] = {}
    out = []
    for body in bodies:
        r = rewrite_request(body, api, ctx(provider, memory, **settings))
        memory.update(session_updates(r))
        out.append(r)
    return out
