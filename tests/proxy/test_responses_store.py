"""The response store is bounded in entries, bytes and age, and forgets what is deleted."""

from __future__ import annotations

import time

from prefixgate.cache.responses_store import MemoryResponseStore, StoredResponse


def _rec(i: int, text: str = "x") -> StoredResponse:
    return StoredResponse(f"resp_{i}", "local", {"id": f"resp_{i}", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": text}]}]},
        [{"type": "message", "role": "user", "content": "q"}])


def test_least_recently_used_goes_first_past_max_entries() -> None:
    store = MemoryResponseStore(max_entries=2)
    store.put(_rec(1))
    store.put(_rec(2))
    assert store.get("resp_1") is not None  # 1 is now the most recent
    store.put(_rec(3))
    assert [store.get(f"resp_{i}") is not None for i in (1, 2, 3)] == [True, False, True]


def test_bytes_stay_under_the_bound_and_an_oversized_response_is_not_kept() -> None:
    store = MemoryResponseStore(max_bytes=1000)
    for i in range(20):
        store.put(_rec(i, "y" * 100))
        assert store.bytes <= 1000
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
