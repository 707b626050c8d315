"""Dated price table, USD per 1M tokens, for pricing cache outcomes (:mod:`prefixgate.cache.savings.cost`).

Sources (as published on 2026-11-29; verify before billing anyone):

* Anthropic — https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing": base
  input, 5m cache writes, 1h cache writes, cache hits & refreshes, output). Writes are 1.25× (5m)
  and 2× (1h) base input, reads 0.1×.
* OpenAI — https://developers.openai.com/api/docs/pricing (input, cached input, output). OpenAI
  bills no cache-write premium, so both write columns equal the input price.
* ``local`` (our engine, vLLM/SGLang you run) — 0: no per-token bill.

Model ids are matched by longest prefix after :func:`prefixgate.config.cache_rules.normalize_model_id`
(``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixgate.config.cache_rules import normalize_model_id

PRICES_AS_OF = "2026-11-29"
ANTHROPIC_PRICING_URL = "https://platform.claude.com/docs/en/about-claude/pricing"
OPENAI_PRICING_URL = "https://developers.openai.com/api/docs/pricing"


@dataclass(frozen=True)
class ModelPrice:
    """USD per 1M tokens: ``input`` (uncached), ``cached_input`` (cache read),
    ``cache_write_5m`` / ``cache_write_1h`` (cache creation), ``output``; ``source``: URL."""

    input: float
    cached_input: float
    cache_write_5m: float
    cache_write_1h: float
    output: float
    source: str


def _claude(inp: float, out: float) -> ModelPrice:
    return ModelPrice(inp, round(inp * 0.1, 6), round(inp * 1.25, 6), round(inp * 2.0, 6), out,
                      ANTHROPIC_PRICING_URL)


def _gpt(inp: float, cached: float, out: float) -> ModelPrice:
    return ModelPrice(inp, cached, inp, inp, out, OPENAI_PRICING_URL)


PRICES: dict[str, ModelPrice] = {
    # Anthropic
    "claude-opus-4-5": _claude(5.0, 25.0),
    "claude-opus-4-6": _claude(5.0, 25.0),
    "claude-opus-4-1": _claude(15.0, 75.0),
    "claude-opus-4": _claude(15.0, 75.0),
    "claude-3-opus": _claude(15.0, 75.0),
    "claude-sonnet-4-6": _claude(3.0, 15.0),
    "claude-sonnet-4-5": _claude(3.0, 15.0),
    "claude-sonnet-4": _claude(3.0, 15.0),
    "claude-3-7-sonnet": _claude(3.0, 15.0),
    "claude-3-5-sonnet": _claude(3.0, 15.0),
    "claude-haiku-4-5": _claude(1.0, 5.0),
    "claude-3-5-haiku": _claude(0.8, 4.0),
    "claude-3-haiku": ModelPrice(0.25, 0.03, 0.30, 0.50, 1.25, ANTHROPIC_PRICING_URL),
    # OpenAI
    "gpt-4o": _gpt(2.50, 1.25, 10.00),
    "gpt-4o-mini": _gpt(0.15, 0.075, 0.60),
    "gpt-4.1": _gpt(2.00, 0.50, 8.00),
    "gpt-4.1-mini": _gpt(0.40, 0.10, 1.60),
    "gpt-4.1-nano": _gpt(0.10, 0.025, 0.40),
    "gpt-5": _gpt(1.25, 0.125, 10.00),
    "gpt-5-mini": _gpt(0.25, 0.025, 2.00),
    "gpt-5-nano": _gpt(0.05, 0.005, 0.40),
    "o3": _gpt(2.00, 0.50, 8.00),
    "o4-mini": _gpt(1.10, 0.275, 4.40),
    # Self-hosted
    "local": ModelPrice(0.0, 0.0, 0.0, 0.0, 0.0, "self-hosted: no per-token price"),
}

_NORMALIZED = {normalize_model_id(k): v for k, v in PRICES.items()}


def backend_priced(model: str) -> bool:
    """Whether a backend's own ``price_per_mtok`` prices ``model``: the table has no price for
    it, or only the self-hosted row (``local``, 0 USD)."""
    p = price_for(model)
    return p is None or p == PRICES["local"]


def backend_input_usd(price_per_mtok: float, cached_price_per_mtok: float, prompt: int | None,
                      cached: int | None) -> float | None:
    """USD of a prompt of ``prompt`` tokens, ``cached`` of them from the prefix cache, at a
    backend's own per-1M-token prices (uncached at ``price_per_mtok``, cached at
    ``cached_price_per_mtok``; no write premium: an engine's cache writes are its prefill);
    None when the prompt size is unknown."""
    if prompt is None:
        return None
    read = min(max(cached or 0, 0), prompt)
    return ((prompt - read) * price_per_mtok + read * cached_price_per_mtok) / 1e6


def price_for(model: str) -> ModelPrice | None:
    """Price of ``model`` by longest matching id prefix, or ``None`` when unknown."""
    m = normalize_model_id(model)
    best = ""
    for prefix in _NORMALIZED:
        if m.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return _NORMALIZED[best] if best else None
