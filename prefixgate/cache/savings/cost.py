"""Price a :class:`~prefixgate.cache.provider_models.base.CacheOutcome` with the dated table in
:mod:`prefixgate.config.prices` (USD).

cost = uncached × input + reads × cached_input + 5m writes × cache_write_5m
       + 1h writes × cache_write_1h + output × output        (all per 1M tokens)
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixgate.cache.provider_models.base import CacheOutcome
from prefixgate.config.prices import ModelPrice, price_for


class UnknownPriceError(KeyError):
    """No price is known for the model id."""


@dataclass(frozen=True)
class Cost:
    """USD split of one request (or a sum of them)."""

    uncached_usd: float = 0.0
    cached_read_usd: float = 0.0
    cache_write_usd: float = 0.0
    output_usd: float = 0.0

    @property
    def input_usd(self) -> float:
        """Everything billed for the prompt."""
        return self.uncached_usd + self.cached_read_usd + self.cache_write_usd

    @property
    def total_usd(self) -> float:
        """Prompt plus output."""
        return self.input_usd + self.output_usd

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.uncached_usd + other.uncached_usd,
                    self.cached_read_usd + other.cached_read_usd,
                    self.cache_write_usd + other.cache_write_usd,
                    self.output_usd + other.output_usd)


def _price(model: str, price: ModelPrice | None) -> ModelPrice:
    p = price or price_for(model)
    if p is None:
        raise UnknownPriceError(f"no price for model {model!r} in config.prices")
    return p


def price_outcome(outcome: CacheOutcome, model: str, output_tokens: int = 0,
                  price: ModelPrice | None = None) -> Cost:
    """USD of ``outcome`` (+ ``output_tokens``) for ``model``. Raises
    :class:`UnknownPriceError` when the model is not in the table and no ``price`` is given."""
    p = _price(model, price)
    write_5m = outcome.cache_write_tokens - outcome.cache_write_1h_tokens
    return Cost(
        uncached_usd=outcome.uncached_tokens * p.input / 1e6,
        cached_read_usd=outcome.cached_read_tokens * p.cached_input / 1e6,
        cache_write_usd=(write_5m * p.cache_write_5m
                         + outcome.cache_write_1h_tokens * p.cache_write_1h) / 1e6,
        output_usd=output_tokens * p.output / 1e6,
    )


def price_without_cache(input_tokens: int, model: str, output_tokens: int = 0,
                        price: ModelPrice | None = None) -> Cost:
    """USD of the same request if nothing were cached (every input token at the input price)."""
    return price_outcome(CacheOutcome(input_tokens, 0, 0, input_tokens), model, output_tokens,
                         price)
