"""One bridge per (client API, backend API) pair (layer 3): dicts and bytes only, no HTTP.

:func:`bridge_for` is the table: the direction is chosen once, here, and the pipeline calls
the object it gets (:class:`Bridge`: request, answer, error, stream). Passthrough is the identity
bridge. A new API pair is one file (``<client>_<backend>.py``) and one row.

=================  ==============  ==========================================================
client             backend         bridge
=================  ==============  ==========================================================
openai             openai          :class:`Bridge` (identity, any endpoint path)
anthropic          anthropic       :class:`Bridge` (identity)
anthropic          openai          :class:`~prefixgate.proxy.bridges.anthropic_openai.AnthropicToOpenAI`
openai             anthropic       :class:`~prefixgate.proxy.bridges.openai_anthropic.OpenAIToAnthropic`
responses          responses       :class:`~prefixgate.proxy.bridges.responses_identity.ResponsesIdentity`
responses          openai          :class:`~prefixgate.proxy.bridges.responses_chat.ResponsesToChat`
responses          anthropic       ``ResponsesToChat`` over ``OpenAIToAnthropic``
=================  ==============  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefixgate.proxy.bridges.anthropic_openai import AnthropicToOpenAI
from prefixgate.proxy.bridges.base import Bridge, BridgeApi
from prefixgate.proxy.bridges.openai_anthropic import OpenAIToAnthropic
from prefixgate.proxy.bridges.responses_chat import Keep, ResponsesToChat
from prefixgate.proxy.bridges.responses_identity import KeepPointer, ResponsesIdentity

__all__ = ["AnthropicToOpenAI", "Bridge", "BridgeApi", "OpenAIToAnthropic", "ResponsesIdentity",
           "ResponsesState", "ResponsesToChat", "bridge_for"]


@dataclass
class ResponsesState:
    """What a Responses bridge needs of its request: the client's ``body``, the stored items of
    its ``previous_response_id`` chain (``history``), and the store's hooks (None: not stored)."""

    body: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    keep: Keep | None = None
    keep_pointer: KeepPointer | None = None


def bridge_for(client: BridgeApi, wire: BridgeApi, path: str | None = None,
               responses: ResponsesState | None = None) -> Bridge:
    """The bridge for a client of ``client`` on a backend speaking ``wire`` (module docstring's
    table). ``path``: the endpoint's own path when both speak the same API (default: the API's
    chat path); ``responses``: the request's state, for a Responses client. Raises ValueError
    for a pair with no bridge."""
    if client == "responses":
        state = responses if responses is not None else ResponsesState({})
        if wire == "responses":
            return ResponsesIdentity(state.keep_pointer)
        inner = OpenAIToAnthropic() if wire == "anthropic" else None
        return ResponsesToChat(state.body, state.history, state.keep, inner)
    if client == wire:
        return Bridge(client, wire, path or ("/messages" if wire == "anthropic" else "/chat/completions"))
    if (client, wire) == ("anthropic", "openai"):
        return AnthropicToOpenAI()
    if (client, wire) == ("openai", "anthropic"):
        return OpenAIToAnthropic()
    raise ValueError(f"no bridge from {client} to {wire}")
