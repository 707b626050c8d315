"""An autouse fixture for the ledger writer's tests: a test whose writer thread hangs (a lost
wake-up, a flush that never returns) ends the run after :data:`HANG_S` seconds with every
thread's stack printed (:func:`faulthandler.dump_traceback_later`, exit status 1) instead of
hanging it — the mutation run of ``ledger_writer.py`` (``bench/mutation_score.py``) counts it
as a failure in seconds, not after its whole time limit."""

from __future__ import annotations

import faulthandler
from collections.abc import Iterator

import pytest

HANG_S = 30.0


@pytest.fixture(autouse=True)
def hang_guard() -> Iterator[None]:
    """Arm the watchdog for one test; disarm it after."""
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
