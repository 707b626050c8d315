"""One bad row costs one row, not its batch (issue 34, "a content error isolates the row").

Both ledger writers commit many rows per transaction. When the database refuses a batch for its
*content* (a value the column does not take — :mod:`prefixgate.cache.ledger.sanitize` rewrites the
ones known, this is what is left), the transaction rolls back and, before this module, every row
in it was dropped: up to 512 requests of other tenants, or every row of a spooled outage.
:func:`commit_isolating` bisects instead: the batch is split in halves and each half committed on
its own, down to the single rows that still fail, which alone are dropped. One bad row in a batch
of n costs about 2·log2(n) extra transactions; k bad rows at most 2·k·log2(n).

A *fault* (the database unreachable, a lock timeout: :data:`is_fault` says which) is not content:
it is raised at once, untouched, so the caller spools or retries the whole batch. Each
transaction is all-or-nothing and the writers' inserts are idempotent where it matters (the
PostgreSQL ledger's ``row_id``), so halves already committed when a fault interrupts are not
doubled when the batch is sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def commit_isolating(items: Sequence[T], commit: Callable[[Sequence[T]], None],
                     is_fault: Callable[[BaseException], bool],
                     on_bad: Callable[[T, BaseException], None]) -> int:
    """Commit ``items`` with ``commit`` (one transaction per call, all or nothing), bisecting
    on a content error; call ``on_bad(item, error)`` for each item that fails alone and
    return how many did. An error for which ``is_fault`` is True propagates (halves already
    committed stay committed)."""
    try:
        commit(items)
        return 0
    except Exception as e:
        if is_fault(e):
            raise
        if len(items) == 1:
            on_bad(items[0], e)
            return 1
    mid = len(items) // 2
    return (commit_isolating(items[:mid], commit, is_fault, on_bad)
            + commit_isolating(items[mid:], commit, is_fault, on_bad))
