"""A request leaves no garbage only the cycle collector can free (issue 34 item 4).

A bridged ``/v1/responses`` request kept its whole exchange — body, raw bytes, the rewriter's
IR — in a reference cycle (the exchange held a closure over itself), so each request's memory
waited for a full collection; and a per-request :func:`gc.freeze` for large bodies then froze
that garbage out of the collector for good (+4.2 MB RSS per 1.3 MiB request, without bound).

Here the request runs with the automatic collector off; afterwards every object the collector
finds unreachable is inspected: none may be the proxy's pipeline, the rewriter's, the bridges'
or the cache's (reference counting freed them when the request ended). httpx's own objects of
the in-process test client are not ours to judge. And large rewrites freeze nothing: cyclic
garbage pending before a run of ≥ 1 MiB rewrites is collectable after them.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import RewriteSettings
from prefixgate.proxy.app import build_app
from prefixgate.proxy.pipeline.rewrite import rewrite_off_loop
from prefixgate.rewriter.types import Context, RewriteResult

OURS = ("prefixgate.proxy.pipeline", "prefixgate.proxy.bridges", "prefixgate.proxy.api",
        "prefixgate.rewriter", "prefixgate.cache")


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}})


BODIES = {
    "/v1/responses": {"model": "m", "instructions": "Be brief.", "input": [
        {"type": "message", "role": "user" if i % 2 == 0 else "assistant",
         "content": f"turn {i}: the flight to Paris, seat {i}"} for i in range(40)]},
    "/v1/chat/completions": {"model": "m", "messages": [
        {"role": "system", "content": "Be brief. " * 50},
        {"role": "user", "content": "the flight to Paris"}]},
}


async def _garbage_after(tmp: Path, path: str) -> list[str]:
    policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": "http://up.test/v1"}},
                           "routes": [{"match": "*", "backend": "up"}],
                           "ledger": {"path": str(tmp / "l.sqlite"), "batch_writes": False}})
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(_answer))
    state = app.state.proxy
    await state.upstream.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pg") as c:
        for i in range(2):  # warm: imports, tokenizer, memos
            assert (await c.post(path, json=BODIES[path], headers={"x-prefixgate-session": f"w{i}"})
                    ).status_code == 200
        await asyncio.sleep(0.2)
        gc.collect()
        gc.disable()
        try:
            r = await c.post(path, json=BODIES[path], headers={"x-prefixgate-session": "s"})
            assert r.status_code == 200, r.text
            del r
            await asyncio.sleep(0.2)  # the after-answer work and the row
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            found = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                            if type(o).__module__.startswith(OURS)})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    await state.upstream.close()
    return found


@pytest.mark.parametrize("path", list(BODIES))
def test_a_request_leaves_no_cycle_of_the_proxys_objects(tmp_path: Path, path: str) -> None:
    assert asyncio.run(_garbage_after(tmp_path, path)) == []


class _Node:
    me: Any = None


def test_large_rewrites_leave_pending_cyclic_garbage_collectable() -> None:
    def cycle() -> _Node:
        n = _Node()
        n.me = (n, bytearray(1 << 16))
        return n

    held = [cycle()]
    ref = weakref.ref(held[0])
    gc.collect()  # the cycle is old now (as a finished request's would be) ...
    held.clear()  # ... and garbage, waiting for a full collection

    def noop(body: dict[str, Any], api: str, ctx: Context) -> RewriteResult:
        return RewriteResult(body, [])

    big_raw = b" " * (2 << 20)  # a body of 2 MiB: once frozen for such a rewrite
    frozen_before = gc.get_freeze_count()
    try:
        for _ in range(2):
            anyio.run(rewrite_off_loop, noop, {"model": "m", "messages": []}, big_raw, "openai",
                      Context(RewriteSettings()))
        gc.collect()
        assert ref() is None
        assert gc.get_freeze_count() == frozen_before  # the rewrites froze nothing
    finally:
        gc.unfreeze()
