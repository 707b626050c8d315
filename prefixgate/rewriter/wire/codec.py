"""Dispatch between the two wire formats: :func:`parse` and :func:`render` by API name."""

from __future__ import annotations

from typing import Any

from prefixgate.rewriter.wire import anthropic as wire_anthropic
from prefixgate.rewriter.wire import openai as wire_openai
from prefixgate.rewriter.wire.ir import Api, Prompt


def parse(body: dict[str, Any], api: Api) -> Prompt:
    """Wire body -> IR. ``api``: ``"openai"`` (Chat Completions) or ``"anthropic"`` (Messages)."""
    if api == "openai":
        return wire_openai.parse(body)
    if api == "anthropic":
        return wire_anthropic.parse(body)
    raise ValueError(f"unknown api {api!r}")


def render(prompt: Prompt) -> dict[str, Any]:
    """IR -> wire body of ``prompt.api``."""
    return wire_openai.render(prompt) if prompt.api == "openai" else wire_anthropic.render(prompt)
