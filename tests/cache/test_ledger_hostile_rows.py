"""Hostile values never cost other rows (issue 34, item 3, the SQLite side): a model name with a
lone surrogate, a usage count past 64 bits, NUL in a tenant, megabyte strings are cleaned
(:mod:`prefixgate.cache.ledger.sanitize`) and stored; a value SQLite still refuses costs its own
row only (:mod:`prefixgate.cache.ledger.isolate`), never the batch of other requests around it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from prefixgate.cache.ledger.isolate import commit_isolating
from prefixgate.cache.ledger.sanitize import DEFAULT_LIMIT, REPLACEMENT, clean_row, clean_text
from prefixgate.cache.ledger.store import Ledger, LedgerRow
from prefixgate.cache.ledger.writer import BatchedLedger
from tests.cache.hang_guard import hang_guard  # noqa: F401  (autouse: a hung writer fails fast)

HOSTILE: dict[str, dict[str, Any]] = {
    "nul model": {"model": "gpt\x00-4o"},
    "lone surrogate model": {"model": "m\ud800odel"},
    "lone low surrogate tenant": {"tenant": "t\udfff"},
    "usage past 64 bits": {"prompt_tokens": 2 ** 70, "cached_tokens": -(2 ** 64)},
    "megabyte error text": {"error": "e" * (1 << 20)},
    "non-finite timings": {"ttft_ms": math.inf, "tpot_ms": math.nan},
}


def test_clean_text_replaces_what_no_store_takes_and_bounds_the_length() -> None:
    assert clean_text("plain-model") == "plain-model"
    assert clean_text("a\x00b") == f"a{REPLACEMENT}b"
    assert clean_text("a\ud800b\udfffc") == f"a{REPLACEMENT}b{REPLACEMENT}c"
    assert clean_text("\ud83d\ude00") == "\U0001F600"  # a pair written as two code points: joined
    assert clean_text("é\x00") == f"é{REPLACEMENT}"
    assert clean_text("x" * 10_000) == "x" * DEFAULT_LIMIT
    assert clean_text("{" + "1" * 100 + "}", 50, over="") == ""  # JSON is emptied, never cut
    for s in ("a\x00b", "a\ud800", "é" * 300):
        s2 = clean_text(s)
        s2.encode("utf-8")  # what sqlite3 and psycopg do with it: no error
        assert "\x00" not in s2


def test_clean_row_keeps_numbers_in_range_and_drops_the_rest_to_null() -> None:
    row = clean_row({"prompt_tokens": 2 ** 63, "cached_tokens": 2 ** 63 - 1, "ttft_ms": math.inf,
                     "tpot_ms": 1.5, "stream": True, "output_tokens": None})
    assert row == {"prompt_tokens": None, "cached_tokens": 2 ** 63 - 1, "ttft_ms": None,
                   "tpot_ms": 1.5, "stream": True, "output_tokens": None}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_row_is_stored_cleaned_and_its_batch_neighbours_with_it(tmp_path: Path,
                                                                          case: str) -> None:
    led = BatchedLedger(tmp_path / "l.sqlite")
    with led._lock:  # the writer is held: all 40 rows go in one batch
        for i in range(40):
            led.write(LedgerRow(**{"model": f"m{i}", "tenant": "t",
                                   **(HOSTILE[case] if i == 17 else {})}))
    rows = led.rows()
    assert len(rows) == 40 and led.state().get("bad_rows_dropped", 0) == 0
    assert [r["model"] for i, r in enumerate(rows) if i != 17] == [f"m{i}" for i in range(40)
                                                                   if i != 17]
    assert sum(r["data"]["requests"] for r in led.rollups(0, 4e9)) == 40
    bad = rows[17]
    assert "\x00" not in bad["model"] and len(bad["error"]) <= 4096
    led.close()


def test_the_one_row_writer_stores_a_hostile_row_instead_of_raising(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    led.write(LedgerRow(model="m\ud800", tenant="t\x00"))
    led.write_break("s\ud800", {"kind": "x"}, tenant="t\ud800")
    assert [r["model"] for r in led.rows()] == [f"m{REPLACEMENT}"]
    assert led.breaks() == [{"kind": "x"}]
    led.close()


def test_a_value_sqlite_still_refuses_costs_its_own_row_only(tmp_path: Path) -> None:
    """A value the cleaning does not know (here an object sqlite3 cannot bind, standing for any
    future one) is isolated by bisecting the batch: 39 of 40 rows land, the one is counted."""
    led = BatchedLedger(tmp_path / "l.sqlite")
    with led._lock:
        for i in range(40):
            row = LedgerRow(model=f"m{i}")
            if i == 23:
                row.prompt_tokens = {"not": "a number"}  # type: ignore[assignment]
            led.write(row)
    rows = led.rows()
    assert [r["model"] for r in rows] == [f"m{i}" for i in range(40) if i != 23]
    assert led.bad_rows_dropped == 1 and led.state()["bad_rows_dropped"] == 1
    assert sum(r["data"]["requests"] for r in led.rollups(0, 4e9)) == 39
    led.close()


def test_bisecting_drops_exactly_the_bad_items_and_lets_faults_through() -> None:
    committed: list[int] = []
    bad: list[int] = []
    calls = 0

    def commit(items: Any) -> None:
        nonlocal calls
        calls += 1
        if any(i % 100 == 7 for i in items):
            raise ValueError("content")
        committed.extend(items)

    n = commit_isolating(list(range(512)), commit, lambda e: isinstance(e, OSError),
                         lambda item, e: bad.append(item))
    assert n == 6 and bad == [7, 107, 207, 307, 407, 507]
    assert sorted(committed) == [i for i in range(512) if i % 100 != 7]
    assert calls < 6 * 2 * 10 + 1  # about 2·log2(n) transactions per bad item, not n

    def down(items: Any) -> None:
        raise OSError("unreachable")

    with pytest.raises(OSError):
        commit_isolating([1, 2, 3], down, lambda e: isinstance(e, OSError), lambda i, e: None)
