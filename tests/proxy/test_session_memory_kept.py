"""What the proxy keeps of a session with a large prompt (issue 34 item 17: ~3.5 MB kept per
1 MB-prompt session). The after-answer analysis kept each large text twice — the break
detector's copy of the last request and the counterfactual cache model's — and the passes'
token memo kept it a third time. Each distinct text is now one string shared by both
structures, and the token memo keeps a long text's digest, not the text. The resident memory
per session is measured by ``bench/memory_loop.py`` (``session_mb_per_session``)."""

from __future__ import annotations

import gc
from typing import Any

from prefixgate.proxy.observe.insight import Insight

BIG = 200_000


def _big_strings(root: Any) -> dict[int, int]:
    """id -> length of every str of BIG characters or more reachable from ``root``."""
    seen: set[int] = set()
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if type(o) is str:
            if len(o) >= BIG:
                out[id(o)] = len(o)
            continue
        if isinstance(o, int | float | bytes | type(None)):
            continue
        todo.extend(gc.get_referents(o))
    return out


def test_the_analysis_keeps_each_large_text_once() -> None:
    insight = Insight()
    for i in range(3):  # three sessions, each its own large system prompt
        system = f"Session {i} rules: " + "verify the user id before booking. " * 8_000
        body = {"model": "m", "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": f"hello {i}"}]}
        insight.observe(session=f"s{i}", backend="up", provider="radix", api="openai", model="m",
                        original=body, sent=body)
    kept = _big_strings(insight)
    assert len(kept) == 3  # one string per session's prompt, shared by the detector and the model


def test_a_large_requests_end_trims_the_heap_once_and_a_small_ones_never(monkeypatch: Any) -> None:
    import asyncio
    import threading

    from prefixgate.proxy.core import heap

    if heap._LIBC is None:  # not glibc: nothing to trim
        return
    trimmed: list[str] = []
    done = threading.Event()

    def fake_trim() -> bool:
        trimmed.append(threading.current_thread().name)
        done.set()
        return True

    monkeypatch.setattr(heap, "trim", fake_trim)
    monkeypatch.setattr(heap, "TRIM_DELAY_S", 0.0)
    monkeypatch.setattr(heap, "_last_trim", 0.0)

    async def go() -> None:
        heap.trim_soon(10_000)                # small: nothing
        heap.trim_soon(heap.LARGE_BYTES)      # large: one trim, in its own thread
        heap.trim_soon(heap.LARGE_BYTES)      # one already pending: not another
        await asyncio.sleep(0.05)
        await asyncio.to_thread(done.wait, 5)

    asyncio.run(go())
    assert trimmed == ["heap-trim"]
    assert heap.configure() is True  # glibc takes the fixed mmap threshold
