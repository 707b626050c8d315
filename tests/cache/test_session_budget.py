"""Session memory is bounded in bytes, per session and in total, evicted LRU (issue 8, class 2)."""

from __future__ import annotations

import json
from typing import Any

from prefixgate.cache.state.session import (
    ENTRY_OVERHEAD_BYTES,
    MemorySessionStore,
    fit,
    json_bytes,
    value_bytes,
)
from prefixgate.rewriter.analysis.learned_volatility import LINE_DIGEST_CHARS, MAX_TRACKED_LINES, unpack
from prefixgate.rewriter.passes import hoist_volatile
from prefixgate.rewriter.wire import codec as wire
from tests.rewriter.helpers import ctx


def _hoist_memory(lines: int, seed: int = 0) -> dict[str, Any]:
    system = "\n".join(f"Rule {i} for tenant {seed}: keep answers short." for i in range(lines))
    body = {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": "hi"}]}
    _, edits = hoist_volatile.run(wire.parse(body, "openai"), ctx())
    merged: dict[str, Any] = {}
    for e in edits:
        merged.update(e.memory)
    return merged


def test_hoist_memory_of_a_session_does_not_grow_with_the_prompt() -> None:
    small, big = _hoist_memory(MAX_TRACKED_LINES), _hoist_memory(50 * MAX_TRACKED_LINES)
    assert value_bytes(big) == value_bytes(small) < 4 * 1024
    lines = big[hoist_volatile.MEMORY_KEY]["lines"]
    assert isinstance(lines, str) and len(unpack(lines, LINE_DIGEST_CHARS)) == MAX_TRACKED_LINES


def test_the_store_never_holds_more_than_its_byte_budget_and_evicts_the_oldest() -> None:
    mem = _hoist_memory(2 * MAX_TRACKED_LINES)
    budget = 20 * (value_bytes(mem) + 300)
    s = MemorySessionStore(max_bytes=budget)
    for i in range(200):
        s.merge(f"s{i}", mem)
        assert s.bytes_used <= budget
    kept = [f"s{i}" for i in range(200) if s.get(f"s{i}")]
    assert 10 <= len(kept) < 200 and kept == [f"s{i}" for i in range(200 - len(kept), 200)]
    assert s.bytes_used == sum(  # the counter is exact, not an estimate drifting away
        sum(value_bytes(k) + value_bytes(v) for k, v in s.get(sid).items())
        + ENTRY_OVERHEAD_BYTES + len(sid) for sid in kept)


def test_a_recently_read_session_survives_eviction() -> None:
    s = MemorySessionStore()
    for sid in ("a", "b", "c"):
        s.merge(sid, {"k": "x" * 100})
    s.max_bytes = s.bytes_used  # full: the next session pushes one out
    s.get("a")
    s.merge("d", {"k": "x" * 100})
    assert s.get("a") and not s.get("b")


def test_a_session_over_its_budget_loses_its_largest_key_only() -> None:
    s = MemorySessionStore(max_session_bytes=4096)
    s.merge("a", {"small": [1, 2, 3], "huge": "x" * 10_000})
    assert dict(s.get("a")) == {"small": [1, 2, 3]}


def test_redis_values_are_fitted_by_their_json_length() -> None:
    mem = {"a": "x" * 50, "b": "y" * 500, "c": [1] * 10}
    out, size, dropped = fit(mem, 200, json_bytes)
    assert dropped == ["b"] and out == {"a": "x" * 50, "c": [1] * 10}
    assert size <= 200 and len(json.dumps(out, separators=(",", ":"))) <= 200


def test_memory_written_in_the_old_list_form_is_still_read() -> None:
    assert unpack(["0123456789abcdef", 7], LINE_DIGEST_CHARS) == ["0123456789abcdef"]
    assert unpack("ABCDefgh" * 2, LINE_DIGEST_CHARS) == ["ABCDefgh"] * 2
    assert unpack("short", LINE_DIGEST_CHARS) == []
