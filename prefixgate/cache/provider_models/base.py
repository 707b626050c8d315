"""Shared interface of the provider cache models: :class:`CacheOutcome` and :class:`CacheModel`.

A provider model is an in-memory imitation of what a provider's prompt cache would do with a
sequence of requests: ``model.process(body, now_s)`` returns how the request's input tokens split
into cache reads, cache writes and uncached tokens, and updates the model's cache state. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from prefixgate.cache.provider_models.prefix_blocks import PrefixBlock


class CacheRuleError(ValueError):
    """A request the provider would reject for caching reasons (e.g. more than 4 Anthropic
    breakpoints, or a 1h breakpoint after a 5m one). The API answers such requests with a 400."""


@dataclass(frozen=True)
class CacheOutcome:
    """How one request's input tokens split under a provider's cache rules.

    ``input_tokens`` (all prompt tokens) = ``cached_read_tokens`` + ``cache_write_tokens`` +
    ``uncached_tokens``. ``cache_write_tokens`` are tokens billed at a cache-write rate
    (Anthropic only; OpenAI and radix engines do not bill writes, so 0 there), of which
    ``cache_write_1h_tokens`` at the 1-hour rate. ``routing_key``: the cache partition the request
    landed on (OpenAI machine key), for diagnosis.
    """

    input_tokens: int
    cached_read_tokens: int
    cache_write_tokens: int
    uncached_tokens: int
    cache_write_1h_tokens: int = 0
    routing_key: str = ""

    def __post_init__(self) -> None:
        parts = self.cached_read_tokens + self.cache_write_tokens + self.uncached_tokens
        if parts != self.input_tokens or min(self.cached_read_tokens, self.cache_write_tokens,
                                             self.uncached_tokens) < 0:
            raise ValueError(f"inconsistent CacheOutcome: {self}")
        if not 0 <= self.cache_write_1h_tokens <= self.cache_write_tokens:
            raise ValueError("cache_write_1h_tokens must be within cache_write_tokens")

    @property
    def cached_share(self) -> float:
        """Cache reads / all input tokens (0.0 for an empty prompt)."""
        return self.cached_read_tokens / self.input_tokens if self.input_tokens else 0.0

    def anthropic_usage(self) -> dict[str, int]:
        """Usage in Anthropic's shape: ``{"input_tokens" (uncached, after the last breakpoint),
        "cache_creation_input_tokens", "cache_read_input_tokens"}``."""
        return {
            "input_tokens": self.uncached_tokens,
            "cache_creation_input_tokens": self.cache_write_tokens,
            "cache_read_input_tokens": self.cached_read_tokens,
        }

    def openai_usage(self) -> dict[str, Any]:
        """Usage in OpenAI Chat's shape: ``{"prompt_tokens", "prompt_tokens_details":
        {"cached_tokens"}}`` (``prompt_tokens`` includes the cached ones)."""
        return {
            "prompt_tokens": self.input_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_read_tokens},
        }


class CacheModel(Protocol):
    """What every provider model offers."""

    provider: str

    def process(self, body: dict[str, Any], now_s: float,
                blocks: list[PrefixBlock] | None = None) -> CacheOutcome:
        """Account one request sent at simulated time ``now_s`` (seconds, monotonic) and update the
        cache state. ``blocks``: the body already flattened by
        :func:`prefixgate.cache.provider_models.prefix_blocks.flatten` for the provider's API
        (optional, saves work).
        Raises :class:`CacheRuleError` for requests the provider rejects."""
        ...

    def clone(self) -> CacheModel:
        """An independent copy of the cache state (processing a request in one does not change
        the other): a model of "the same cache, from here on fed other bodies"."""
        ...
