"""A 30 MB body does not hold the event loop while it is parsed (issue 34 item 15): ``/healthz``
waited 1.1-1.3 s behind one 30 MB single-string chat body, most of it orjson's parse plus the
numbers' proof (a re-serialisation of the whole body and seven byte searches) on the loop. A body
above 1 MiB is now parsed in a worker thread (the loop runs between its C calls), and a large
body's proof tries the cheap no-float test first (one regex pass, no copy of the body).
The time itself is measured by ``bench/memory_loop.py`` (``healthz_max_s_30mb``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.proxy.app import build_app
from prefixgate.proxy.core import exactjson


def _answer(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={
        "id": "c1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}})


def test_a_large_body_is_parsed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_on: list[tuple[int, str]] = []
    real = exactjson.loads

    def spy(raw: Any) -> Any:
        parsed_on.append((len(raw), threading.current_thread().name))
        return real(raw)

    monkeypatch.setattr(exactjson, "loads", spy)
    policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": "http://up.test/v1"}},
                           "routes": [{"match": "*", "backend": "up"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite"), "batch_writes": False}})
    app = build_app(policy, ledger=Ledger(policy.ledger.path), transport=httpx.MockTransport(_answer),
                    analyze=False)
    small = {"model": "m", "messages": [{"role": "user", "content": "hi " * 400}]}
    large = {"model": "m", "messages": [{"role": "user", "content": "the flight to Paris " * 110_000}]}

    async def go() -> None:
        await app.state.proxy.upstream.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pg") as c:
            for body in (small, large):
                r = await c.post("/v1/chat/completions", content=orjson.dumps(body),
                                 headers={"content-type": "application/json"})
                assert r.status_code == 200, r.text
        await app.state.proxy.upstream.close()

    loop_thread = threading.current_thread().name
    asyncio.run(go())
    bodies = [(n, t) for n, t in parsed_on if n > 1000]
    assert len(bodies) == 2
    (small_n, small_t), (large_n, large_t) = bodies
    assert large_n > 2_000_000 and small_t == loop_thread  # a small body: at once, on the loop
    assert large_t != loop_thread                           # a large one: in a worker thread


def test_a_large_body_without_floats_is_proven_without_re_serialising(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x " * 700_000}],
                        "max_tokens": 5}).replace(b'":', b'": ')  # not orjson's own bytes
    assert len(raw) >= exactjson.CHEAP_PROOF_FIRST_BYTES

    class NoDumps:
        loads = staticmethod(orjson.loads)
        JSONDecodeError = orjson.JSONDecodeError

        @staticmethod
        def dumps(*a: Any, **k: Any) -> bytes:
            raise AssertionError("a 1.4 MB body was re-serialised to prove its numbers")

    monkeypatch.setattr(exactjson, "orjson", NoDumps)
    assert exactjson.loads(raw)["max_tokens"] == 5


ENDS = (b",", b"]", b"}", b" ", b"\n", b"\r", b"\t")


@given(st.lists(st.sampled_from([b"-0", b"-", b"0", b"1", b",", b"]", b"}", b" ", b"\n", b"\r", b"\t", b"a",
                                 b"-01", b"\"", b"."]), max_size=30).map(b"".join))
def test_the_minus_zero_search_finds_what_the_seven_searches_found(raw: bytes) -> None:
    old = any(b"-0" + c in raw for c in ENDS) or raw.endswith(b"-0")
    assert (exactjson._MINUS_ZERO.search(raw) is not None) is old
