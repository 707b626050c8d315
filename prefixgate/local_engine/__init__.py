"""prefixgate's local inference engine: a Llama-family forward in plain torch with a KV pool,
a radix-tree prefix cache, continuous batching with chunked prefill, and an OpenAI-compatible
HTTP server (``python -m prefixgate.local_engine``).

Files, one concern each (engine core):

- ``api_types.py``: the facade's data contract (EngineConfig, SamplingParams, RequestOutput,
  PromptTooLong).
- ``engine.py``: the step-loop thread and the ``Engine`` facade (generate / generate_batch /
  abort / stats / shutdown).
- ``scheduler.py``: continuous batching, chunked prefill, LPM admission, retraction.
- ``radix_cache.py``: radix tree of token ids → KV slots, lock_ref, LRU eviction, extra_key.
- ``kv_pool.py``: per-layer K/V storage by slot, page allocator, request → slot table.
- ``model_runner.py``: packs a step into tensors, runs the model; ``attention.py``: ragged
  GQA attention over pool slots; ``model.py``: the Llama-family forward and weight loading.
- ``sampler.py``: greedy / temperature / top-k / top-p with per-request generators;
  ``detokenizer.py``: incremental text and stop strings; ``sequence.py``: a request's state.

The HTTP side (routes, request models, chat template, SSE, tool calls, metrics) is the
``server/`` subpackage; core never imports it (``README.md`` beside this file).

The facade (``Engine``, ``EngineConfig``, ``SamplingParams``, ``RequestOutput``, ``PromptTooLong``)
is imported lazily so that light entry points (``local_engine.fetch_model``) do not load torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineConfig", "PromptTooLong", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from prefixgate.local_engine.engine import Engine

        return Engine
    if name in ("EngineConfig", "SamplingParams", "RequestOutput", "PromptTooLong"):
        from prefixgate.local_engine.sched import api_types

        return getattr(api_types, name)
    raise AttributeError(f"module 'local_engine' has no attribute {name!r}")
