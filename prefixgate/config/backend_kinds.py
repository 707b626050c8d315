"""One table of what each backend kind speaks, caches and reports (issue 18, item 4).

Every site that behaves differently per :data:`prefixgate.config.schema.BackendKind` reads its
row here, so a backend that differs only in data is a row, not code (LiteLLM's
``openai_like/providers.json`` idea). Columns (:class:`KindTraits`):

- ``wire``: the API its chat endpoint speaks (``openai`` Chat Completions or ``anthropic``
  Messages); the proxy bridges a client of the other API.
- ``cache_provider``: whose prefix-cache rules apply (:mod:`prefixgate.cache.provider_models`,
  the rewriter's ``Context.provider``): ``openai`` (automatic, 1,024-token minimum, 128-token
  steps), ``anthropic`` (explicit breakpoints) or ``radix`` (token-exact prefix reuse: our
  engine, vLLM, SGLang, llama.cpp).
- ``otel_provider``: ``gen_ai.provider.name`` (OpenTelemetry GenAI conventions: the listed values
  for hosted APIs, our own names for engines).
- ``output_cap_field``: the Chat Completions field a default output cap goes in (OpenAI
  deprecates ``max_tokens``; engines read ``max_tokens``); ``None``: the API has no default
  (Anthropic requires ``max_tokens`` from the client).
- ``tokenizes``: serves ``POST /tokenize`` beside ``/v1`` (ours, vLLM, SGLang; llama.cpp serves
  it in its own shape and answers 404 to ours, which the callers treat as "not there").
- ``lists_models``: ``GET <base_url>/models`` lists what it serves, worth asking live.
- ``masks_tools``: enforces ``tool_choice`` / ``allowed_tools`` by constrained decoding, so
  tool-pruning passes can leave tools in place (our engine).
- ``default_cache_salt``: a tenant's ``cache_salt`` is added to bodies by default (engines that
  read vLLM's ``cache_salt``: ours).
- ``native_responses``: serves the Responses API itself (``/v1/responses`` is passed through;
  other kinds get the Responses -> Chat bridge).
- ``spawnable``: ``prefixgate serve`` may start it (``spawn: true``).
- ``pins_slots``: its server keeps one prompt cache per slot and takes ``id_slot`` in the body
  (llama.cpp): the proxy pins each conversation to a slot (``Backend.slots`` per deployment,
  :mod:`prefixgate.proxy.routing.slots`). Its ``timings`` (``cache_n``, ``prompt_n``,
  ``prompt_ms``) are read for cached tokens and prefill time
  (:func:`prefixgate.proxy.core.usage.engine_usage`, every OpenAI-shaped answer).
- ``prompt_cache_key``: takes OpenAI's ``prompt_cache_key`` / ``prompt_cache_retention`` (request
  metadata the model never reads). prefixgate adds a per-conversation key by default to these
  kinds only; a fallback of another kind gets the client's body without the keys prefixgate added
  (:func:`prefixgate.proxy.pipeline.prepare.bridges`). A client's own key passes through as sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prefixgate.config.schema import BackendKind

Wire = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class KindTraits:
    """One row of :data:`BACKEND_KINDS` (module docstring)."""

    wire: Wire
    cache_provider: Literal["openai", "anthropic", "radix"]
    otel_provider: str
    output_cap_field: str | None
    tokenizes: bool
    lists_models: bool
    masks_tools: bool
    default_cache_salt: bool
    native_responses: bool
    spawnable: bool
    pins_slots: bool = False
    prompt_cache_key: bool = False


BACKEND_KINDS: dict[str, KindTraits] = {
    "local": KindTraits(wire="openai", cache_provider="radix", otel_provider="prefixgate.engine",
                        output_cap_field="max_tokens", tokenizes=True, lists_models=True,
                        masks_tools=True, default_cache_salt=True, native_responses=False,
                        spawnable=True),
    "openai_compat": KindTraits(wire="openai", cache_provider="radix",
                                otel_provider="openai_compatible", output_cap_field="max_tokens",
                                tokenizes=True, lists_models=True, masks_tools=False,
                                default_cache_salt=False, native_responses=False,
                                spawnable=False),
    "llamacpp": KindTraits(wire="openai", cache_provider="radix", otel_provider="llama.cpp",
                           output_cap_field="max_tokens", tokenizes=False, lists_models=True,
                           masks_tools=False, default_cache_salt=False, native_responses=False,
                           spawnable=False, pins_slots=True),
    "openai": KindTraits(wire="openai", cache_provider="openai", otel_provider="openai",
                         output_cap_field="max_completion_tokens", tokenizes=False,
                         lists_models=False, masks_tools=False, default_cache_salt=False,
                         native_responses=True, spawnable=False, prompt_cache_key=True),
    "anthropic": KindTraits(wire="anthropic", cache_provider="anthropic",
                            otel_provider="anthropic", output_cap_field=None, tokenizes=False,
                            lists_models=False, masks_tools=False, default_cache_salt=False,
                            native_responses=False, spawnable=False),
}


def traits(kind: BackendKind | str) -> KindTraits:
    """The row of ``kind``. Raises KeyError for a kind the schema does not know (the policy's
    validation refuses those first)."""
    return BACKEND_KINDS[kind]
