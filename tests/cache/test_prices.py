"""config.prices: a model id gets the price of its LONGEST matching table id (dated snapshots and
mini / nano variants share a prefix with their base model), per prefixgate/config/prices.py's sources."""

from __future__ import annotations

import pytest

from prefixgate.config.prices import PRICES, price_for


@pytest.mark.parametrize("model", sorted(PRICES))
def test_every_table_id_prices_as_itself(model: str) -> None:
    assert price_for(model) is PRICES[model] or price_for(model) == PRICES[model]


@pytest.mark.parametrize("model,table_id", [
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"), ("gpt-4.1-nano-2025-04-14", "gpt-4.1-nano"),
    ("gpt-5-mini", "gpt-5-mini"), ("claude-opus-4-1-20250805", "claude-opus-4-1"),
    ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5")])
def test_a_dated_or_variant_id_gets_its_longest_prefix_price(model: str, table_id: str) -> None:
    assert price_for(model) == PRICES[table_id]


def test_an_unknown_model_has_no_price() -> None:
    assert price_for("mystery-model-7b") is None
