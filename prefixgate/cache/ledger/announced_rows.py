"""Rows promised to the ledger: the client has its answer, the row is still being filled.

The proxy sends a non-streamed answer before it fills and writes its ledger row (the
counterfactual and break analysis run after the answer, issue 25:
:mod:`prefixgate.proxy.pipeline.after_answer`). A reader of the ledger that asks once the
client has the answer must still see that row (what :meth:`prefixgate.cache.ledger.store.Ledger.rows`
and a batched ledger's flush promised before), so the proxy :meth:`~AnnouncedRows.announce` s
the row before it sends and :meth:`~AnnouncedRows.settle` s it once written, and every read
waits (bounded, :data:`WAIT_S`) until no announced row is left.

A reader on a thread that announced rows still pending does not wait: that thread (the event
loop) is the one that will write them, so waiting there could only time out.
"""

from __future__ import annotations

import threading
from collections import Counter

WAIT_S = 5.0
"""Longest a read waits for announced rows (a row whose after-answer work never ran — a bug —
delays reads by this much, never forever)."""


class AnnouncedRows:
    """A thread-safe count of announced, not yet settled rows, by announcing thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._by_thread: Counter[int] = Counter()

    @property
    def pending(self) -> int:
        """Rows announced and not settled."""
        with self._cv:
            return sum(self._by_thread.values())

    def announce(self) -> int:
        """Announce one row; returns the token :meth:`settle` takes (the announcing thread)."""
        me = threading.get_ident()
        with self._cv:
            self._by_thread[me] += 1
        return me

    def settle(self, token: int) -> None:
        """The row announced with ``token`` is written (or will never be); wakes the readers."""
        with self._cv:
            if self._by_thread[token] > 0:
                self._by_thread[token] -= 1
            if self._by_thread[token] == 0:
                del self._by_thread[token]
            self._cv.notify_all()

    def wait(self, timeout_s: float = WAIT_S) -> bool:
        """Block until no announced row is pending (True), or ``timeout_s`` passes (False).
        Returns at once on a thread with rows of its own pending (module docstring)."""
        me = threading.get_ident()
        with self._cv:
            if self._by_thread.get(me):
                return False
            return self._cv.wait_for(lambda: not self._by_thread, timeout_s)
