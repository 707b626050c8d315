"""Provider cache models: what Anthropic, OpenAI or a radix-cache engine would cache.

``make_model(provider, count_tokens)`` builds one; all share ``process(body, now_s) ->
CacheOutcome`` (:mod:`prefixgate.cache.provider_models.base`).
"""

from __future__ import annotations

from prefixgate.cache.provider_models.anthropic import AnthropicCacheModel
from prefixgate.cache.provider_models.base import CacheModel, CacheOutcome, CacheRuleError
from prefixgate.cache.provider_models.openai import OpenAICacheModel
from prefixgate.cache.provider_models.prefix_blocks import TokenCounter
from prefixgate.cache.provider_models.radix import RadixCacheModel

PROVIDERS = ("anthropic", "openai", "radix")


def make_model(provider: str, count_tokens: TokenCounter) -> CacheModel:
    """A fresh cache model for ``provider`` (``"anthropic" | "openai" | "radix"``).

    Raises ``ValueError`` for another name.
    """
    if provider == "anthropic":
        return AnthropicCacheModel(count_tokens)
    if provider == "openai":
        return OpenAICacheModel(count_tokens)
    if provider == "radix":
        return RadixCacheModel(count_tokens)
    raise ValueError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")


__all__ = [
    "PROVIDERS",
    "AnthropicCacheModel",
    "CacheModel",
    "CacheOutcome",
    "CacheRuleError",
    "OpenAICacheModel",
    "RadixCacheModel",
    "make_model",
]
