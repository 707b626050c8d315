"""Run CPU work off the event loop under a time budget (issue 8, class 2).

:func:`off_loop` runs a function in a worker thread and gives up waiting past its budget: the
after-answer analysis (:mod:`prefixgate.proxy.observe.insight`), the edit-detail header
(:mod:`prefixgate.proxy.pipeline.edit_detail`). The rewrite step has its own, with a thread limit
and a deadline the pipeline itself checks (:func:`prefixgate.proxy.pipeline.rewrite.rewrite_off_loop`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

log = logging.getLogger("prefixgate.rewrite")

T = TypeVar("T")


async def off_loop(fn: Callable[[], T], budget_ms: int, fallback: T) -> T:
    """``fn()`` in a worker thread, or ``fallback`` once ``budget_ms`` has passed (the thread is
    abandoned and its result dropped). For the after-answer analysis
    (:mod:`prefixgate.proxy.observe.insight`):
    ``await off_loop(analyze, policy.rewrite.time_budget_ms, Analysis())``. Exceptions of
    ``fn`` propagate."""
    with anyio.move_on_after(budget_ms / 1000):
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    log.warning("after-answer work over its %d ms budget; skipped", budget_ms)
    return fallback
