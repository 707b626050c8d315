"""An autouse fixture for the ledger writer's tests: a test whose writer thread hangs (a lost
wake-up, a flush that never returns) ends the run after :data:`HANG_S` seconds with every
thread's stack printed (:func:`faulthandler.dump_traceback_later`, exit status 1) instead of
hanging it — the mutation run of ``cache/ledger/writer.py`` (``mutation/score.py``) counts it
as a failure in seconds, not after its whole time limit. Armed only where
``PREFIXGATE_HANG_GUARD_S`` is set (the mutation run sets it): in ``make test`` a slow, loaded
machine must never end the whole test process."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator

import pytest

HANG_S = float(os.environ.get("PREFIXGATE_HANG_GUARD_S", "0") or 0)


@pytest.fixture(autouse=True)
def hang_guard() -> Iterator[None]:
    """Arm the watchdog for one test (when :data:`HANG_S` > 0); disarm it after."""
    if HANG_S <= 0:
        yield
        return
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
