"""A row whose body went upstream as the client sent it gets its own measured cached tokens as
its counterfactual at record time, so the report's cached share and "cached if unrewritten" are
taken over the same rows (a side endpoint's rows used to count in one and not the other)."""

from __future__ import annotations

import pytest

from prefixgate.cache.ledger.store import LedgerRow
from prefixgate.cache.savings.counterfactual import measured_counterfactual


@pytest.mark.parametrize("edits", ["", "none", "off", "unavailable"])
def test_a_body_sent_as_is_is_its_own_counterfactual(edits: str) -> None:
    row = LedgerRow(edits=edits, prompt_tokens=100, cached_tokens=64, input_usd=0.001)
    measured_counterfactual(row)
    assert (row.cf_cached_tokens, row.cf_input_usd, row.cf_source) == (64, 0.001, "measured")


def test_a_holdout_row_says_holdout() -> None:
    row = LedgerRow(edits="off", holdout=True, prompt_tokens=100, cached_tokens=10)
    measured_counterfactual(row)
    assert (row.cf_cached_tokens, row.cf_source) == (10, "holdout")


@pytest.mark.parametrize("row", [
    LedgerRow(edits="hoist_volatile", prompt_tokens=100, cached_tokens=90),  # edited: modelled
    LedgerRow(edits="", prompt_tokens=100, cached_tokens=None),              # nothing reported
    LedgerRow(edits="none", prompt_tokens=100, cached_tokens=50, cf_cached_tokens=7,
              cf_source="modelled"),                                          # already set
])
def test_edited_unreported_or_already_set_rows_are_left_alone(row: LedgerRow) -> None:
    before = (row.cf_cached_tokens, row.cf_input_usd, row.cf_source)
    measured_counterfactual(row)
    assert (row.cf_cached_tokens, row.cf_input_usd, row.cf_source) == before
