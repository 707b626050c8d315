"""Work after the answer, off the client's critical path: a response that runs it once sent.

The ledger row, the cache-break record, the counterfactual and the pass attribution
(:func:`prefixgate.proxy.pipeline.record.finish`) cost more CPU than the rest of a request on a
29 KB agent body (issue 25's profile: the after-answer analysis was a third of a rewritten
request's samples). None of it changes what the client gets, so a non-streamed answer is sent
first and the work runs after: :class:`AfterResponse` awaits ``after`` once its body has gone
out — or once sending failed, or the send was cancelled (shielded) — exactly once, so every
request still writes exactly one ledger row. The server reads the connection's next request
as soon as the body is out (uvicorn marks the response complete at its last body message), so a
keep-alive client's next turn is not held behind the analysis.

What must be in place before the client can send its next turn stays before the response:
session memory (:func:`prefixgate.proxy.pipeline.record.merge_memory`), read by that turn's
rewrite. Rows keep the order of their answers (:class:`RecordOrder`: a row is recorded once the
row of the answer sent before it is, so a sequential client's rows stay in request order while
the analyses themselves overlap). The row is announced to the ledger before the send
(:mod:`prefixgate.cache.ledger.announced_rows`), so a reader that asks once the client has its answer
still sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger("prefixgate.proxy")

After = Callable[[], Awaitable[None]]


class AfterResponse(Response):
    """A :class:`starlette.responses.Response` that awaits ``after()`` once sent (module
    docstring). ``after`` failing is logged, never raised (the client has its answer)."""

    def __init__(self, content: bytes, *, after: After, status_code: int = 200,
                 headers: dict[str, str] | None = None, media_type: str | None = None) -> None:
        super().__init__(content, status_code=status_code, headers=headers,
                         media_type=media_type)
        self._after: After | None = after

    async def run_after(self) -> None:
        """Run ``after`` if it has not run yet; never raises."""
        after, self._after = self._after, None
        if after is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await after()
            except Exception:
                log.exception("after-answer work failed")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.run_after()


ORDER_WAIT_S = 5.0
"""Longest a row waits for the row of the answer before it (a lost predecessor delays, never
blocks, the rows after it)."""


ANALYZE_MAX_PENDING = 64
"""Answers whose rows are not recorded yet above which a new answer's after-answer analysis
(cache breaks, counterfactual) is skipped — its row still written, with what is known, as for a
body too large to analyse. Under a sustained load the analysis falls behind the answers (it is
the heavier part on a 29 KB body); unbounded, the waiting tasks grew past the server's
``limits.max_connections`` and new requests got 503s (issue 25's benchmark under ``wrk``)."""


class _Turn(asyncio.Event):
    """One answer's "recorded" event; setting it (once) lowers its order's ``pending``."""

    def __init__(self, order: RecordOrder) -> None:
        super().__init__()
        self._order = order

    def set(self) -> None:
        if not self.is_set():
            self._order.pending -= 1
        super().set()


class RecordOrder:
    """The order answers were made in, for recording their rows in it (module docstring).
    One per proxy (its event loop). ``pending``: answers whose rows are not recorded yet;
    ``shed``: analyses skipped because there were more than :data:`ANALYZE_MAX_PENDING`."""

    def __init__(self) -> None:
        self._tail: asyncio.Event | None = None
        self.pending = 0
        self.shed = 0

    def turn(self) -> tuple[asyncio.Event | None, asyncio.Event]:
        """``(the previous answer's "recorded" event or None, this answer's)``: set this
        answer's event once its row is recorded (or will never be)."""
        prev, mine = self._tail, _Turn(self)
        self._tail = mine
        self.pending += 1
        return prev, mine

    def shed_analysis(self) -> bool:
        """True (and counted, logged at the first and every 1000th) when more than
        :data:`ANALYZE_MAX_PENDING` rows wait: the caller skips its analysis."""
        if self.pending <= ANALYZE_MAX_PENDING:
            return False
        if self.shed % 1000 == 0:
            log.warning("%d answers' rows pending: after-answer analysis skipped (%d so far)",
                        self.pending, self.shed + 1)
        self.shed += 1
        return True

    async def wait(self, prev: asyncio.Event | None) -> None:
        """:meth:`after`, unless more than :data:`ANALYZE_MAX_PENDING` rows wait: then at once.
        Each waiting row wakes the next one loop iteration later, so under a sustained load a
        chain of waits drains one row per iteration while answers come faster, and the waiting
        tasks grew without bound (503s past ``limits.max_connections``); past the bound rows are
        recorded as they finish. A sequential client never has that many rows pending."""
        if self.pending > ANALYZE_MAX_PENDING:
            return
        await self.after(prev)

    @staticmethod
    async def after(prev: asyncio.Event | None) -> None:
        """Wait until ``prev`` is set, at most :data:`ORDER_WAIT_S`."""
        if prev is None or prev.is_set():
            return
        try:
            await asyncio.wait_for(prev.wait(), ORDER_WAIT_S)
        except TimeoutError:
            log.warning("the previous answer's row was not recorded within %.0f s", ORDER_WAIT_S)
