"""The fan-out gate's decisions, pinned by hand (issue 21): :class:`GateCore` on an explicit
clock (the writer, the hold budget, the EWMA of TTFT, the warm window, a failed writer) and
:func:`fanout_key` (what is shared, the tenant's scope)."""

from __future__ import annotations

import hashlib

import pytest

from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.core import exactjson
from prefixgate.proxy.routing import fanout as fo
from prefixgate.proxy.routing.fanout import GateCore, fanout_key

S = FanoutSettings(enabled=True, max_hold_ms=5000, ttft_factor=2.0, warm_s=300.0, min_prefix_bytes=0)


def test_the_first_request_writes_and_the_next_waits_the_hold_budget() -> None:
    g = GateCore(S)
    assert g.arrive("k", 10.0) is None and g.is_writer("k", 10.0)
    assert not g.is_writer("k", 10.5)
    assert g.arrive("k", 11.0) == 11.0 + 5.0  # no TTFT seen yet: max_hold_ms
    assert g.arrive("other", 11.0) is None  # another prefix writes on its own


def test_the_hold_budget_is_the_shorter_of_the_cap_and_factor_times_ttft() -> None:
    g = GateCore(S)
    assert g.hold_budget_s() == 5.0
    g.ttft_ewma_s = 1.0
    assert g.hold_budget_s() == 2.0  # 2 x 1 s < 5 s
    g.ttft_ewma_s = 4.0
    assert g.hold_budget_s() == 5.0  # 2 x 4 s > 5 s: the cap


def test_an_answered_writer_makes_the_prefix_warm_and_feeds_the_ewma() -> None:
    g = GateCore(S)
    g.arrive("k", 10.0)
    g.answered("k", 13.0, ok=True)  # TTFT 3 s: the first observation is the EWMA
    assert g.ttft_ewma_s == 3.0 and g.warm["k"] == 313.0 and "k" not in g.writers
    assert g.arrive("k", 312.9) is None and "k" not in g.writers  # warm: go, no new writer
    assert g.arrive("k", 313.0) is None and g.writers == {"k": 313.0}  # expired: a new writer
    g.answered("k", 315.0, ok=True)  # TTFT 2 s: 0.8 x 3 + 0.2 x 2 = 2.8
    assert g.ttft_ewma_s == pytest.approx(2.8, rel=1e-12)


def test_a_failed_writer_leaves_the_prefix_cold_and_the_ewma_alone() -> None:
    g = GateCore(S)
    g.arrive("k", 10.0)
    g.answered("k", 12.0, ok=False)
    assert g.warm == {} and g.ttft_ewma_s is None and g.writers == {}
    assert g.arrive("k", 12.5) is None and g.is_writer("k", 12.5)  # the next one writes
    g.answered("nobody", 13.0, ok=True)  # no writer of that key: nothing recorded
    assert g.warm == {} and g.ttft_ewma_s is None


def test_the_warm_table_keeps_the_newest_max_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fo, "MAX_KEYS", 2)
    g = GateCore(S)
    for i, k in enumerate("abc"):
        g.arrive(k, float(i))
        g.answered(k, float(i) + 0.5, ok=True)
    assert list(g.warm) == ["b", "c"]
    g.arrive("b", 400.0)  # b expired: written again, now the newest
    g.answered("b", 401.0, ok=True)
    assert list(g.warm) == ["c", "b"]


def test_the_key_hashes_the_tenant_scope_then_the_shared_part() -> None:
    body = {"model": "m", "tools": [{"name": "t"}], "system": "s", "messages": [{"a": 1}, {"b": 2}],
            "max_tokens": 5}
    shared = {"model": "m", "tools": [{"name": "t"}], "system": "s", "messages": [{"a": 1}]}
    raw = exactjson.dumps(shared)
    assert fanout_key(body, "acme") == (hashlib.sha256(b"4:acme|" + raw).hexdigest()[:32], len(raw))
    assert fanout_key(body) == (hashlib.sha256(b"0:|" + raw).hexdigest()[:32], len(raw))
    # the last message and other fields are not part of the key
    assert fanout_key({**body, "messages": [{"a": 1}, {"c": 3}], "max_tokens": 9})[0] == fanout_key(body)[0]
    no_list = exactjson.dumps({"model": "m", "tools": None, "system": None, "messages": None})
    assert fanout_key({"model": "m", "messages": "x"}) == (
        hashlib.sha256(b"0:|" + no_list).hexdigest()[:32], len(no_list))
    assert fanout_key(body, "\ud800")[0] == hashlib.sha256(
        b"3:\xed\xa0\x80|" + raw).hexdigest()[:32]  # a lone surrogate is scoped, never an error
