"""Issue 20 Low: the rate limiter's Redis keys ignored ``ledger.redis_prefix`` (two proxies
sharing a Redis under different prefixes shared, and reset, each other's limits). Every key a
proxy writes — limits, sessions, shared routing — is under its prefix."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import hash_key
from tests.proxy.conftest import make_policy
from tests.proxy.upstream import Script, completion
from tests.servers import serve_app

REDIS = "redis://127.0.0.1:6379/0"
KEY = "pgk-prefix-test-0123456789abcdefghijklmnopqrstuvwxyz"


def _client() -> Any:
    import redis

    c = redis.Redis.from_url(REDIS)
    try:
        c.ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    return c


def test_two_proxies_under_different_prefixes_keep_their_own_limits(
        tmp_path: Path, upstream: Any) -> None:
    client = _client()
    up, up_url = upstream
    up.script = Script(body=completion())
    kid = "k_" + uuid.uuid4().hex[:10]
    prefixes = [f"pgtest-{uuid.uuid4().hex[:6]}:", f"pgtest-{uuid.uuid4().hex[:6]}:"]
    key = {"id": kid, "hash": hash_key(KEY), "rpm": 2, "tpm": 1_000_000}
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    try:
        codes = []
        for i, prefix in enumerate(prefixes):
            policy = make_policy(up_url, tmp_path / f"l{i}.sqlite", auth={"keys": [key]},
                                 ledger={"path": str(tmp_path / f"l{i}.sqlite"),
                                         "redis_url": REDIS, "redis_prefix": prefix})
            with serve_app(build_app(policy, ledger=Ledger(policy.ledger.path),
                                     rewrite_fn=None, analyze=False)) as url:
                codes.append([httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                                         headers={"authorization": f"Bearer {KEY}",
                                                  "x-prefixgate-session": "s1"}).status_code
                              for _ in range(3)])
        assert codes == [[200, 200, 429], [200, 200, 429]]  # each prefix: its own rpm 2
        for prefix in prefixes:
            assert list(client.scan_iter(f"{prefix}rl:{kid}:*"))
        assert not list(client.scan_iter(f"prefixgate:rl:{kid}:*"))  # the old, fixed prefix
        assert not list(client.scan_iter(f"*rl:{kid}:*")) or all(
            k.decode().startswith(tuple(prefixes)) for k in client.scan_iter(f"*rl:{kid}:*"))
    finally:
        for prefix in prefixes:
            for k in client.scan_iter(f"{prefix}*"):
                client.delete(k)
