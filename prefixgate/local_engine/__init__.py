"""prefixgate's local inference engine: a Llama-family forward in plain torch with a KV pool,
a radix-tree prefix cache, continuous batching with chunked prefill, speculative decoding, P/D
disaggregation and an OpenAI-compatible HTTP server (``python -m prefixgate.local_engine``).

Packages by concern, one layer order, lower never importing higher (import-linter holds it):

- ``kv/``: the KV pool and its pages, the radix tree (``radix_cache``), block hashes, KV events;
- ``model/``: the Llama forward (``llama``), ragged attention, model files, fetching the model;
  ``model/quant/``: int8 weights, packed CPU linears, the screened LM head;
- ``sched/``: a request's state, the scheduler (batching, chunked prefill, admission), the KV
  manager, the model runner, sampling, detokenizing, the facade's data contract (``api_types``);
- ``spec/``: drafters, verification, the speculative decoder's factory and metrics;
- ``pd/``: the prefill and decode roles, the KV link between them and the KV export / import;
- ``engine.py``: the step-loop thread and the ``Engine`` facade that composes them;
- ``server/``: the HTTP side over one ``Engine``; the core never imports it.

``README.md`` beside this file: the layers, where each thing is, where a new one goes.

The facade (``Engine``, ``EngineConfig``, ``SamplingParams``, ``RequestOutput``, ``PromptTooLong``)
is imported lazily so that light entry points (``local_engine.model.fetch``) do not load torch.
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
