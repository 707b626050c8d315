"""Rewriting runs off the event loop under a per-request time budget (issue 8, class 2).

No clocks in the assertions: a rewrite that blocks on an event is, by construction, past any
budget; other requests finishing while it is blocked shows the loop is free.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.pipeline.rewrite import OVER_BUDGET, run_rewrite
from prefixgate.rewriter.pipeline import OverBudget, rewrite_request
from prefixgate.rewriter.types import Context, RewriteResult
from tests.proxy.upstream import Script, completion

BODY = {"model": "m", "messages": [
    {"role": "system", "content": "Request ID: req_8f3a9c2e7b1d4f60a9b7\n" + "Answer briefly. " * 40},
    {"role": "user", "content": "hi"}]}
"""A per-request id (hoisted on a session's first request where ``hoist_volatile``, opt-in, is
on) before a stable instruction."""
RAW = b'{"model": "m",   "messages": [{"role": "system", "content": "s"}, ' \
      b'{"role": "user", "content": "hi"}]}'


def _blocking(release: threading.Event, entered: threading.Event, slow_session: str) -> Any:
    def fn(body: Any, api: str, ctx: Context) -> RewriteResult:
        if ctx.session_id == slow_session:
            entered.set()
            release.wait(30)
        return rewrite_request(body, api, ctx)  # type: ignore[arg-type]
    return fn


def test_a_rewrite_past_its_budget_sends_the_clients_own_bytes_and_says_so(rig_factory: Any) -> None:
    release, entered = threading.Event(), threading.Event()
    rig = rig_factory(rewrite_fn=_blocking(release, entered, "slow"),
                      rewrite={"time_budget_ms": 50})
    rig.upstream.script = Script(body=completion())
    try:
        r = httpx.post(rig.url + "/v1/chat/completions", content=RAW, timeout=30,
                       headers={"content-type": "application/json", "x-prefixgate-session": "slow"})
    finally:
        release.set()
    assert r.status_code == 200 and r.headers["x-prefixgate-edits"] == OVER_BUDGET
    assert entered.is_set() and rig.upstream.seen[-1].raw == RAW  # exactly as sent
    assert rig.ledger.rows()[-1]["edits"] == OVER_BUDGET


def test_other_requests_are_served_while_a_rewrite_is_running(rig_factory: Any) -> None:
    release, entered = threading.Event(), threading.Event()
    # hoist_volatile (opt-in): the slow request's answer shows its rewrite ran to the end
    rig = rig_factory(rewrite_fn=_blocking(release, entered, "slow"),
                      rewrite={"time_budget_ms": 60_000, "hoist_volatile": True})
    rig.upstream.script = Script(body=completion())
    url = rig.url + "/v1/chat/completions"
    slow: list[httpx.Response] = []
    t = threading.Thread(target=lambda: slow.append(httpx.post(
        url, json=BODY, headers={"x-prefixgate-session": "slow"}, timeout=60)))
    t.start()
    try:
        assert entered.wait(30)
        fast = [httpx.post(url, json=BODY, headers={"x-prefixgate-session": f"f{i}"}, timeout=30)
                for i in range(3)]
        assert [f.status_code for f in fast] == [200, 200, 200]
        assert not slow  # served while the slow rewrite was still blocked
    finally:
        release.set()
        t.join(60)
    assert slow[0].status_code == 200 and "hoist_volatile" in slow[0].headers["x-prefixgate-edits"]


def test_the_pipeline_stops_before_a_pass_once_its_deadline_has_passed() -> None:
    ctx = Context(RewriteSettings(), deadline=0.0)  # monotonic time 0: long past
    with pytest.raises(OverBudget) as e:
        rewrite_request(BODY, "openai", ctx)
    assert e.value.stage == "canonicalize_tools"
    out = run_rewrite(rewrite_request, BODY, RAW, "openai", ctx)  # type: ignore[arg-type]
    assert out.summary == OVER_BUDGET and out.raw == RAW and out.body is BODY
    assert not out.applied and "time budget" in out.edits[0].detail


def test_after_answer_work_past_its_budget_yields_the_fallback() -> None:
    import anyio

    from prefixgate.proxy.core.offload import off_loop

    release = threading.Event()

    def stuck() -> str:
        release.wait(30)
        return "late"
    try:
        assert anyio.run(off_loop, stuck, 20, "fallback") == "fallback"
    finally:
        release.set()
    assert anyio.run(off_loop, lambda: "done", 60_000, "fallback") == "done"
