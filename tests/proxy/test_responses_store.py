"""The response store is bounded in entries, bytes actually held and age, and forgets what is
deleted (issue 20, Medium 9: it counted JSON bytes but held ~7.6x that in Python objects)."""

from __future__ import annotations

import gc
import time
import tracemalloc

from prefixgate.cache.state.responses_store import MemoryResponseStore, StoredResponse
from prefixgate.proxy.core import exactjson


def _rec(i: int, text: str = "x") -> StoredResponse:
    return StoredResponse(f"resp_{i}", "local", {"id": f"resp_{i}", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": text}]}]},
        [{"type": "message", "role": "user", "content": "q"}])


def _agent_rec(i: int, items: int) -> StoredResponse:
    """A conversation as agents build them: many small items (the shape whose Python objects
    weigh ~7x their JSON), fresh strings the store keeps once the caller lets go."""
    history = [{"type": "message", "role": "user" if j % 2 else "assistant",
                "content": [{"type": "input_text", "text": f"turn {j} of {i}: " + "w" * 40}]}
               for j in range(items)]
    calls = [{"type": "function_call", "call_id": f"call_{i}_{j}", "name": "search",
              "arguments": '{"q": "x"}'} for j in range(items // 4)]
    return StoredResponse("resp_" + str(i).zfill(24), "local",
                          {"id": f"resp_{i}", "object": "response", "status": "completed",
                           "output": calls, "usage": {"input_tokens": 10 * items}},
                          history, tenant="tenant-" + str(i))


def _held_after_puts(store: MemoryResponseStore, make: list[tuple[int, int]]) -> int:
    """Bytes tracemalloc sees allocated by putting ``make`` [(i, items)] and letting go."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i, items in make:
            rec = _agent_rec(i, items)
            store.put(rec)
            del rec
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_bytes_counted_are_the_bytes_held_for_large_responses() -> None:
    store = MemoryResponseStore(max_entries=10**6, max_bytes=1 << 40)
    held = _held_after_puts(store, [(i, 400) for i in range(100)])  # ~8 MB of JSON
    assert store.bytes > 5 << 20
    assert held <= 1.5 * store.bytes, (held, store.bytes)
    assert store.bytes <= 1.5 * held, (held, store.bytes)  # not a loose over-count either


def test_bytes_counted_are_the_bytes_held_for_tiny_responses() -> None:
    # per-entry overhead dominates here; orjson's own output object kept a ~4 KB buffer each
    store = MemoryResponseStore(max_entries=10**6, max_bytes=1 << 40)
    held = _held_after_puts(store, [(i, 1) for i in range(3000)])
    assert held <= 1.5 * store.bytes, (held, store.bytes)


def test_the_byte_bound_holds_in_memory_under_lru_eviction() -> None:
    bound = 4 << 20
    store = MemoryResponseStore(max_entries=10**6, max_bytes=bound)
    held = _held_after_puts(store, [(i, 200) for i in range(200)])  # ~16 MB offered
    assert store.bytes <= bound and len(store) < 200
    assert held <= 1.5 * bound, held
    assert store.get(f"resp_{'199'.zfill(24)}") is not None  # the newest stay
    assert store.get(f"resp_{'0'.zfill(24)}") is None  # the oldest went


def test_a_read_is_a_fresh_copy_with_numbers_exact() -> None:
    store = MemoryResponseStore(dumps=exactjson.dumps, loads=exactjson.loads)
    body = exactjson.loads(b'{"id":"r","output":[],"n":123456789012345678901234567890,"f":1.10}')
    store.put(StoredResponse("r", "local", body, [{"type": "message", "content": "q"}], "t"))
    got = store.get("r")
    assert got is not None and got.tenant == "t" and got.backend == "local"
    assert exactjson.dumps(got.response) == exactjson.dumps(body)
    got.input_items.append({"type": "x"})
    again = store.get("r")
    assert again is not None and len(again.input_items) == 1


def test_least_recently_used_goes_first_past_max_entries() -> None:
    store = MemoryResponseStore(max_entries=2)
    store.put(_rec(1))
    store.put(_rec(2))
    assert store.get("resp_1") is not None  # 1 is now the most recent
    store.put(_rec(3))
    assert [store.get(f"resp_{i}") is not None for i in (1, 2, 3)] == [True, False, True]


def test_bytes_stay_under_the_bound_and_an_oversized_response_is_not_kept() -> None:
    store = MemoryResponseStore(max_bytes=3000)
    for i in range(20):
        store.put(_rec(i, "y" * 100))
        assert store.bytes <= 3000
    assert len(store) < 20
    store.put(_rec(99, "z" * 5000))
    assert store.get("resp_99") is None


def test_entries_expire_after_the_ttl_and_delete_forgets() -> None:
    store = MemoryResponseStore(ttl_s=0.05)
    store.put(_rec(1))
    assert store.delete("resp_1") and not store.delete("resp_1")
    store.put(_rec(2))
    time.sleep(0.1)
    assert store.get("resp_2") is None and store.bytes == 0


def test_history_is_input_then_output() -> None:
    rec = _rec(1, "answer")
    assert [i.get("role") or i["type"] for i in rec.history()] == ["user", "message"]
