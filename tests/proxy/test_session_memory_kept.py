"""What the proxy keeps of a session with a large prompt (issue 34 item 17: ~3.5 MB kept per
1 MB-prompt session). The after-answer analysis kept each large text twice — the break
detector's copy of the last request and the counterfactual cache model's — and the passes'
token memo kept it a third time. Each distinct text is now one string shared by both
structures, and the token memo keeps a long text's digest, not the text. The resident memory
per session is measured by ``bench/memory_loop.py`` (``session_mb_per_session``)."""

from __future__ import annotations

import gc
import types
from typing import Any

from prefixgate.proxy.observe.insight import Insight

SIZE = 10_000


def _kept_bytes(root: Any) -> int:
    """Bytes of the strings and byte strings of SIZE or more reachable from ``root``, each
    object counted once."""
    seen: set[int] = set()
    total = 0
    todo = [root]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if type(o) in (str, bytes):
            total += len(o) if len(o) >= SIZE else 0
            continue
        if isinstance(o, dict):  # its keys too (a str-keyed dict does not report them to gc)
            todo.extend(o.keys())
            todo.extend(o.values())
            continue
        if isinstance(o, types.FunctionType):  # a closure's cells, not its module's globals
            todo.extend(c.cell_contents for c in o.__closure__ or ())
            continue
        if isinstance(o, int | float | type(None) | type | types.ModuleType
                      | types.BuiltinFunctionType | types.MethodType | types.CodeType):
            continue  # what the analysis keeps, not the code and modules it refers to
        todo.extend(gc.get_referents(o))
    return total


def test_the_analysis_keeps_a_large_prompt_once_and_compressed() -> None:
    insight = Insight()
    size = 0
    for i in range(3):  # three sessions, each its own large system prompt, two turns each
        system = f"Session {i} rules: " + "".join(
            f"rule {k}: verify the user id before booking seat {k % 97}. " for k in range(5_000))
        size += len(system)
        for turn in range(2):
            body = {"model": "m", "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": f"hello {i} {turn}"}]}
            insight.observe(session=f"s{i}", backend="up", provider="radix", api="openai",
                            model="m", original=body, sent=body)
    # the break detector and the cache model kept each prompt twice (2 x size); now one
    # compressed copy shared by both
    assert _kept_bytes(insight) < size / 2


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
    monkeypatch.setattr(heap, "_pending_since", None)

    async def go() -> None:
        heap.trim_soon(10_000)                # small: nothing
        heap.trim_soon(heap.LARGE_BYTES)      # large: one trim, in its own thread
        heap.trim_soon(heap.LARGE_BYTES)      # one already pending: not another
        await asyncio.sleep(0.05)
        await asyncio.to_thread(done.wait, 5)

    asyncio.run(go())
    assert trimmed == ["heap-trim"]
    assert heap.configure() is True  # glibc takes the fixed mmap threshold


def test_the_analysis_token_memo_keeps_no_long_text() -> None:
    from prefixgate.cache.provider_models.prefix_blocks import memo_counter

    calls: list[int] = []

    def counter(text: str) -> int:
        calls.append(len(text))
        return len(text) // 4

    count = memo_counter(counter)
    long_text = "verify the user id before booking. " * 30_000
    assert count(long_text) == count("".join([long_text])) == len(long_text) // 4
    assert calls == [len(long_text)]  # counted once
    memo = count.__closure__[count.__code__.co_freevars.index("memo")].cell_contents  # type: ignore[index]
    assert not any(isinstance(k, str) and len(k) > 10_000 for k in memo)


def test_only_a_served_app_freezes_its_startup_objects(tmp_path: Any) -> None:
    import asyncio

    from prefixgate.cache.ledger.store import Ledger
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.app import build_app

    policy = parse_policy({"backends": {"up": {"kind": "openai_compat", "base_url": "http://up.test/v1"}},
                           "routes": [{"match": "*", "backend": "up"}],
                           "ledger": {"path": str(tmp_path / "l.sqlite"), "batch_writes": False}})

    async def started(flag: bool) -> int:
        app = build_app(policy, ledger=Ledger(policy.ledger.path))
        if flag:
            app.state.freeze_startup = True  # what `prefixgate serve` sets
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count()

    gc.unfreeze()
    try:
        assert asyncio.run(started(False)) == 0  # a test's app, a library user's: nothing frozen
        assert asyncio.run(started(True)) > 0
    finally:
        gc.unfreeze()


def test_the_startup_freeze_leaves_later_garbage_collectable() -> None:
    import weakref

    from prefixgate.proxy.core import heap

    class Node:
        me: Any = None

    try:
        assert heap.freeze_startup() > 0
        n = Node()
        n.me = n  # a cycle made after the freeze: garbage the collector must still find
        ref = weakref.ref(n)
        del n
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
