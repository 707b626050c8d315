"""The after-answer work runs once the client has the whole answer, exactly once, whatever
happens to the send (:class:`prefixgate.proxy.pipeline.after_answer.AfterResponse`, issue 25)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from prefixgate.proxy.pipeline.after_answer import AfterResponse

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def test_the_work_runs_after_the_last_body_message() -> None:
    events: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        events.append(message["type"] + ("" if message.get("more_body") else ".last")
                      if message["type"] == "http.response.body" else message["type"])

    async def after() -> None:
        events.append("after")

    anyio.run(AfterResponse(b'{"ok":1}', after=after), SCOPE, _receive, send)
    assert events == ["http.response.start", "http.response.body.last", "after"]


def test_the_work_runs_once_when_the_send_fails() -> None:
    runs: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        raise OSError("client gone")

    async def after() -> None:
        runs.append(1)

    resp = AfterResponse(b"{}", after=after)
    with pytest.raises(OSError):
        anyio.run(resp, SCOPE, _receive, send)
    anyio.run(resp.run_after)  # a second call is a no-op
    assert runs == [1]


def test_a_failing_after_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])

    async def after() -> None:
        raise RuntimeError("ledger down")

    anyio.run(AfterResponse(b"{}", after=after), SCOPE, _receive, send)
    assert sent == ["http.response.start", "http.response.body"]
    assert "after-answer work failed" in caplog.text


def test_rows_keep_the_order_of_their_answers_while_their_work_overlaps() -> None:
    from prefixgate.proxy.pipeline.after_answer import RecordOrder

    order = RecordOrder()
    recorded: list[str] = []
    started: list[str] = []

    async def work(name: str, analysis_s: float) -> None:
        prev, mine = order.turn()
        try:
            started.append(name)
            await anyio.sleep(analysis_s)  # the first answer's analysis is the slow one
            await RecordOrder.after(prev)
            recorded.append(name)
        finally:
            mine.set()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(work, "first", 0.2)
            tg.start_soon(work, "second", 0.0)
            tg.start_soon(work, "third", 0.05)

    anyio.run(main)
    assert started == ["first", "second", "third"]  # the work overlaps ...
    assert recorded == ["first", "second", "third"]  # ... the rows keep the answers' order


def test_a_lost_predecessor_delays_a_row_without_blocking_it(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from prefixgate.proxy.pipeline import after_answer
    from prefixgate.proxy.pipeline.after_answer import RecordOrder

    monkeypatch.setattr(after_answer, "ORDER_WAIT_S", 0.1)
    order = RecordOrder()
    order.turn()  # an answer whose row never comes
    prev, _ = order.turn()

    async def main() -> None:
        with anyio.fail_after(2):
            await RecordOrder.after(prev)

    anyio.run(main)


def test_analysis_is_shed_only_while_more_rows_than_the_bound_wait() -> None:
    from prefixgate.proxy.pipeline.after_answer import ANALYZE_MAX_PENDING, RecordOrder

    async def main() -> None:
        order = RecordOrder()
        turns = [order.turn()[1] for _ in range(ANALYZE_MAX_PENDING)]
        assert order.pending == ANALYZE_MAX_PENDING and not order.shed_analysis()
        extra = order.turn()[1]
        assert order.shed_analysis() and order.shed == 1
        extra.set()
        extra.set()  # twice: counted once
        assert order.pending == ANALYZE_MAX_PENDING and not order.shed_analysis()
        for t in turns:
            t.set()
        assert order.pending == 0

    anyio.run(main)


def test_rows_past_the_bound_do_not_wait_for_their_predecessor() -> None:
    from prefixgate.proxy.pipeline.after_answer import ANALYZE_MAX_PENDING, RecordOrder

    async def main() -> None:
        order = RecordOrder()
        first = order.turn()[1]  # never set: a slow predecessor
        prev = first
        for _ in range(ANALYZE_MAX_PENDING):
            prev, _mine = order.turn()
        with anyio.fail_after(1):
            await order.wait(prev)  # past the bound: at once
        first.set()

    anyio.run(main)


def test_rows_within_the_bound_wait_for_their_predecessor() -> None:
    from prefixgate.proxy.pipeline.after_answer import RecordOrder

    async def main() -> None:
        order = RecordOrder()
        prev, _ = order.turn()
        assert prev is None
        prev, _ = order.turn()
        with anyio.move_on_after(0.2) as scope:
            await order.wait(prev)
        assert scope.cancelled_caught  # still waiting for the first row

    anyio.run(main)
