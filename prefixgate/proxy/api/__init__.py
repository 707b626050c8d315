"""The endpoints (layer 7): each module has ``install(app, state)`` and runs the pipeline.
"""

from __future__ import annotations

from prefixgate.proxy.api.chat import CHAT, MESSAGES
from prefixgate.proxy.api.count_tokens import COUNT_TOKENS
from prefixgate.proxy.api.passthrough import COMPLETIONS, EMBEDDINGS
from prefixgate.proxy.api.responses import RESPONSES

__all__ = ["CHAT", "COMPLETIONS", "COUNT_TOKENS", "EMBEDDINGS", "MESSAGES", "RESPONSES"]
