"""prefixgate's local inference engine: a Llama-family forward in plain torch with a KV pool,
a radix-tree prefix cache, continuous batching with chunked prefill, and an OpenAI-compatible
HTTP server (``python -m local_engine``).

The facade (``Engine``, ``EngineConfig``, ``SamplingParams``, ``RequestOutput``, ``PromptTooLong``)
is imported lazily so that light entry points (``local_engine.fetch_model``) do not load torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineConfig", "PromptTooLong", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from local_engine.engine import Engine

        return Engine
    if name in ("EngineConfig", "SamplingParams", "RequestOutput", "PromptTooLong"):
        from local_engine import api_types

        return getattr(api_types, name)
    raise AttributeError(f"module 'local_engine' has no attribute {name!r}")
