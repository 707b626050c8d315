"""The engine's HTTP side: an OpenAI-compatible API (FastAPI) over the engine core's ``Engine``.

Files, one concern each:

- ``app.py``: the routes and ``build_app(engine)`` (what ``python -m prefixgate.local_engine``
  serves).
- ``protocol.py``: request models and ``ApiError`` (OpenAI's error shape).
- ``jobs.py``: a request -> an engine job: checks first, prompt work in a worker thread.
- ``chat.py``: chat template rendering, messages (+ tools) -> prompt text -> token ids.
- ``tokenize.py``: prompt -> token ids for generation and ``/tokenize`` / ``/detokenize``; the
  size check before tokenizing. ``schema_depth.py``: nesting limits on tools' JSON.
- ``chunks.py``: response bodies and SSE chunks; ``tool_calls.py``: Hermes tool-call parsing.
- ``tool_mask.py`` / ``constrained.py``: a forcing ``tool_choice`` / ``allowed_tools`` as a
  grammar masking logits at decode time.
- ``metrics.py``: the Prometheus registry served at ``GET /metrics``.

This package imports the engine core; the core never imports it. ``build_app`` is imported
lazily, so a light member (``server.protocol``, ``server.chunks``) does not load torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_app"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from prefixgate.local_engine.server.app import build_app

        return build_app
    raise AttributeError(f"module 'local_engine.server' has no attribute {name!r}")
