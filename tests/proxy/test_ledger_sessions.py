"""The SQLite ledger and the session stores (in-process LRU and real Redis)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import COLUMNS, Ledger, LedgerRow
from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.cache.state.session import MemorySessionStore
from prefixgate.cache.state.session_redis import SharedSessionStore
from tests.proxy.upstream import Script, completion


def test_ledger_rows_roundtrip_in_wal_mode(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "sub" / "l.sqlite")
    rid = led.write(LedgerRow(endpoint="/v1/chat/completions", model="m", stream=True,
                              prompt_tokens=100, cached_tokens=None, ttft_ms=12.5))
    row = led.rows()[0]
    assert row["id"] == rid and row["prompt_tokens"] == 100 and row["cached_tokens"] is None
    assert row["ttft_ms"] == 12.5 and row["stream"] == 1
    mode = sqlite3.connect(led.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_ledger_has_no_prompt_text_column_and_stores_none(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    secret_text = "my secret prompt text 12345"
    httpx.post(rig.url + "/v1/chat/completions", timeout=30,
               json={"model": "m", "messages": [{"role": "user", "content": secret_text}]})
    dump = "\n".join(sqlite3.connect(rig.ledger.path).iterdump())
    assert secret_text not in dump
    assert not {"prompt", "messages", "text"} & set(COLUMNS)


def test_ledger_concurrent_writes_all_land(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")

    def work() -> None:
        for _ in range(50):
            led.write(LedgerRow(model="m"))

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(led.rows()) == 200


def test_one_ledger_row_per_request_including_errors(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    url = rig.url + "/v1/chat/completions"
    httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    httpx.post(url, content=b"{bad", headers={"content-type": "application/json"})
    httpx.post(url, json={"model": "zzz", "messages": [{"role": "user", "content": "x"}]})
    statuses = [(r["status"], r["http_status"]) for r in rig.ledger.rows()]
    assert statuses == [("ok", 200), ("InvalidJSON", 400), ("ModelNotFound", 404)]


def test_metrics_count_requests_per_backend_and_status(rig: Any) -> None:
    rig.upstream.script = Script(body=completion())
    httpx.post(rig.url + "/v1/chat/completions",
               json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    text = httpx.get(rig.url + "/metrics").text
    # "m" matched the glob m*, a name the policy does not name: model "other" (issue 20 class 5)
    assert 'prefixgate_requests_total{backend="up",model="other",route="m*",status="ok"} 1.0' in text
    assert 'prefixgate_cached_tokens_total{backend="up",model="other",route="m*"} 4.0' in text


def test_memory_store_merges_shallowly_and_evicts_lru() -> None:
    s = MemorySessionStore(max_sessions=2)
    s.merge("a", {"x": 1})
    s.merge("a", {"y": 2})
    view = s.get("a")
    assert dict(view) == {"x": 1, "y": 2}
    with pytest.raises(TypeError):
        view["z"] = 3  # type: ignore[index]
    s.merge("b", {"x": 1})
    s.get("a")  # a is now the most recent
    s.merge("c", {"x": 1})
    assert dict(s.get("b")) == {} and dict(s.get("a")) == {"x": 1, "y": 2}


def test_redis_store_against_real_redis() -> None:
    import redis

    try:
        redis.Redis.from_url("redis://127.0.0.1:6379/0").ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")
    prefix = f"test-{uuid.uuid4().hex}:"

    async def run() -> None:
        s = SharedSessionStore(RedisLink("redis://127.0.0.1:6379/0", prefix), ttl_s=60)
        other = SharedSessionStore(RedisLink("redis://127.0.0.1:6379/0", prefix))  # a 2nd proxy
        try:
            assert dict(await s.aget("a")) == {}
            await s.amerge("a", {"volatile": ["system:0"]})
            await s.amerge("a", {"n": 2})
            assert dict(await other.aget("a")) == {"volatile": ["system:0"], "n": 2}
            assert 0 < await s.link.client.ttl(prefix + "session:a") <= 60
        finally:
            await s.delete("a")
            await s.link.close()
            await other.link.close()

    asyncio.run(run())


def test_models_and_healthz(rig: Any) -> None:
    models = httpx.get(rig.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list"
    # the upstream lists "scripted-model", but no route sends that name there (issue 10:
    # /v1/models lists exactly what a client can call)
    assert "scripted-model" not in {m["id"] for m in models["data"]}
    assert httpx.get(rig.url + "/healthz", timeout=10).json()["status"] == "ok"


def test_policy_redis_url_shares_session_memory_between_two_proxies(
        rig_factory: Any, tmp_path: Path) -> None:
    import redis

    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url).ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")
    from prefixgate.rewriter.types import Edit, RewriteResult

    views: list[dict[str, Any]] = []

    def remembering(body: Any, api: str, ctx: Any) -> RewriteResult:
        views.append(dict(ctx.session))
        return RewriteResult(body, [Edit("count", False, "params", "x",
                                         memory={"n": ctx.session.get("n", 0) + 1})])

    prefix = f"test-{uuid.uuid4().hex}:"
    ledger = {"path": str(tmp_path / "l.sqlite"), "redis_url": url, "redis_prefix": prefix}
    off = {"enabled": False}  # the guard's trials run the rewrite function too (issue 36)
    a = rig_factory(rewrite_fn=remembering, ledger=ledger, meaning_guard=off)
    b = rig_factory(rewrite_fn=remembering, ledger=ledger, meaning_guard=off)
    a.upstream.script = Script(body=completion())
    sid = "shared-" + uuid.uuid4().hex
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    try:
        for rig in (a, b, a):
            httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=30,
                       headers={"x-prefixgate-session": sid})
        assert views == [{}, {"n": 1}, {"n": 2}]
    finally:
        r = redis.Redis.from_url(url)
        r.delete(*(r.keys(prefix + "*") or [prefix]))
