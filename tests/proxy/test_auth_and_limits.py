"""Proxy keys and rate limits, unit level: hashing and constant-time lookup, which addresses need
keys, ``serve`` refusing to listen unauthenticated, the per-minute windows (memory and Redis),
the ledger's key_id migration, and ``prefixgate keys add / list / remove``."""

from __future__ import annotations

import hmac
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import prefixgate.proxy.http.keystore
from prefixgate.cache.ledger.store import SCHEMA_VERSION, Ledger, LedgerRow
from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.config.loader import load_policy, parse_policy
from prefixgate.config.schema import AuthSettings, ProxyKey
from prefixgate.proxy.cli import app as cli
from prefixgate.proxy.cli.serve import refuse_unauthenticated
from prefixgate.proxy.http.auth import KeyStore, hash_key, needs_keys, new_key, presented_key
from prefixgate.proxy.http.ratelimit import MemoryLimiter, RedisLimiter

POLICY = ("# my policy: comments survive `keys add`\n"
          "backends:\n  b: {kind: openai_compat, base_url: 'http://127.0.0.1:9/v1'}\n"
          "routes:\n  - {match: '*', backend: b}\n")


class Clock:
    """A settable unix-seconds clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _store(n: int) -> tuple[KeyStore, list[str]]:
    keys = [new_key() for _ in range(n)]
    return KeyStore(AuthSettings(keys=[ProxyKey(id=f"k{i}", hash=hash_key(k))
                                       for i, k in enumerate(keys)])), keys


def test_new_keys_are_random_and_stored_only_as_sha256() -> None:
    a, b = new_key(), new_key()
    assert a != b and a.startswith("pgk-") and len(a) >= 40
    assert hash_key(a).startswith("sha256:") and a not in hash_key(a)


@pytest.mark.parametrize("which", [0, 3, 7])
def test_lookup_compares_every_stored_hash_whichever_key_matches(
        monkeypatch: pytest.MonkeyPatch, which: int) -> None:
    store, keys = _store(8)
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(prefixgate.proxy.http.keystore.hmac, "compare_digest", counting)
    found = store.lookup(keys[which])
    assert found is not None and found.id == f"k{which}"
    assert len(calls) == 8  # no early exit: time does not say which key matched
    calls.clear()
    assert store.lookup("pgk-unknown") is None and len(calls) == 8


def test_presented_key_reads_either_header_for_either_api() -> None:
    assert presented_key({"authorization": "Bearer k1"}, "anthropic") == "k1"
    assert presented_key({"x-api-key": "k2"}, "openai") == "k2"
    assert presented_key({"authorization": "bearer  k3 "}, "openai") == "k3"
    assert presented_key({"authorization": "Basic k4"}, "openai") is None
    assert presented_key({"authorization": "Bearer a", "x-api-key": "b"}, "anthropic") == "b"


@pytest.mark.parametrize("host,needs", [
    ("127.0.0.1", False), ("127.9.9.9", False), ("::1", False), ("[::1]", False),
    ("localhost", False), ("0.0.0.0", True), ("::", True), ("10.0.0.5", True),
    ("192.168.1.2", True), ("proxy.internal", True), ("::ffff:10.0.0.1", True),
])
def test_only_loopback_addresses_may_listen_without_keys(host: str, needs: bool) -> None:
    assert needs_keys(host) is needs


def test_serve_refuses_a_non_loopback_address_without_keys(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(POLICY)
    r = CliRunner().invoke(cli, ["serve", "--policy", str(p), "--host", "0.0.0.0"])
    assert r.exit_code == 2
    assert "refusing to listen on 0.0.0.0" in r.output and "prefixgate keys add" in r.output


def test_serve_allows_non_loopback_once_a_key_exists(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(POLICY)
    pol = load_policy(p)
    assert refuse_unauthenticated(pol, "0.0.0.0", p) is not None
    assert refuse_unauthenticated(pol, "127.0.0.1", p) is None
    assert CliRunner().invoke(cli, ["keys", "add", "--policy", str(p)]).exit_code == 0
    assert refuse_unauthenticated(load_policy(p), "0.0.0.0", p) is None


def test_memory_limiter_counts_per_key_per_minute_window() -> None:
    start = 60.0 * 16_667  # a window's first second
    clock = Clock(start + 15)
    lim = MemoryLimiter(clock)
    assert lim.admit_now("a", 2, None) is None and lim.admit_now("a", 2, None) is None
    refused = lim.admit_now("a", 2, None)
    assert refused is not None and refused.kind == "requests" and refused.retry_after_s == 45
    assert lim.admit_now("b", 2, None) is None  # another key: its own count
    clock.now = start + 60  # next window
    assert lim.admit_now("a", 2, None) is None


def test_memory_limiter_refuses_on_tokens_used_and_refusals_use_no_budget() -> None:
    clock = Clock(600.0)
    lim = MemoryLimiter(clock)
    assert lim.admit_now("a", 3, 100) is None
    lim.add_tokens("a", 150)
    for _ in range(5):
        r = lim.admit_now("a", 3, 100)
        assert r is not None and r.kind == "tokens" and r.retry_after_s == 60
    clock.now = 660.0
    assert [lim.admit_now("a", 3, 100) for _ in range(3)] == [None] * 3  # refusals did not count


def test_memory_limiter_charges_the_prompt_with_the_check_and_gives_back_in_its_window() -> None:
    # issue 20 High 4: the check and the prompt's charge are one step
    clock = Clock(600.0)
    lim = MemoryLimiter(clock)
    assert lim.admit_now("a", None, 100, tokens=500) is None
    assert lim.used("a") == (1, 500)
    refused = lim.admit_now("a", None, 100, tokens=1)
    assert refused is not None and refused.kind == "tokens" and lim.used("a") == (1, 500)
    lim.add_tokens("a", -480, window=10)
    assert lim.used("a") == (1, 20)
    lim.add_tokens("a", -10_000)
    assert lim.used("a") == (1, 0)  # never below zero


def _redis() -> Any:
    import redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379 (make test starts one)")
    return client


def test_redis_limiter_is_shared_by_two_proxy_processes_under_the_policy_prefix() -> None:
    import asyncio

    client = _redis()
    clock = Clock(1_200.0)
    prefix = f"pgtest-{uuid.uuid4().hex[:8]}:"
    kid = "k_" + uuid.uuid4().hex[:8]

    async def run() -> None:
        links = [RedisLink("redis://127.0.0.1:6379/0", prefix) for _ in range(2)]
        one, two = (RedisLimiter(link, clock=clock) for link in links)
        try:
            assert await one.admit(kid, 2, 50) is None and await two.admit(kid, 2, 50) is None
            refused = await one.admit(kid, 2, 50)
            assert refused is not None and refused.kind == "requests"
            assert 0 < client.ttl(f"{prefix}rl:{kid}:20:req") <= 120
            clock.now = 1_260.0
            assert await two.admit(kid, 2, 50) is None
            one.add_tokens(kid, 60)
            await one.drain()
            refused = await two.admit(kid, 2, 50)
            assert refused is not None and refused.kind == "tokens"
            assert await one.admit(kid, None, 1000, tokens=7) is None
            assert int(client.get(f"{prefix}rl:{kid}:21:tok")) == 67
        finally:
            for link in links:
                await link.close()

    try:
        asyncio.run(run())
        # issue 20 Low: every key is under the policy's redis_prefix, none under the old one
        assert sorted(client.scan_iter(f"{prefix}rl:{kid}:*")) and not list(
            client.scan_iter(f"prefixgate:rl:{kid}:*"))
    finally:
        for k in client.scan_iter(f"{prefix}*"):
            client.delete(k)


def test_redis_limiter_limits_locally_when_redis_is_down() -> None:
    import asyncio

    async def run() -> None:
        link = RedisLink("redis://127.0.0.1:9/0")  # nothing listens on port 9
        lim = RedisLimiter(link, clock=Clock(0.0))
        assert await lim.admit("k", 1, None) is None
        refused = await lim.admit("k", 1, None)  # the local counters still limit
        assert refused is not None and refused.kind == "requests"
        lim.add_tokens("k", 5)
        await lim.drain()
        assert lim.local.used("k") == (1, 5) and not link.up
        await link.close()

    asyncio.run(run())


def test_ledger_file_without_key_id_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, ts REAL, endpoint TEXT, "
               "model TEXT, status TEXT, http_status INTEGER)")
    db.execute("INSERT INTO requests (ts, endpoint, model, status, http_status) "
               "VALUES (1.0, '/v1/chat/completions', 'm', 'ok', 200)")
    db.commit()
    db.close()
    led = Ledger(path)
    led.write(LedgerRow(model="m2", key_id="k_abc"))
    rows = led.rows()
    assert [r["key_id"] for r in rows] == ["", "k_abc"]  # old row: no key; new row: its id
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_keys_add_prints_the_key_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    p = tmp_path / "team.yaml"
    p.write_text(POLICY)
    r = CliRunner().invoke(cli, ["keys", "add", "--policy", str(p), "--name", "ci",
                                 "--rpm", "60", "--tpm", "1000"])
    assert r.exit_code == 0, r.output
    key = r.stdout.strip()
    assert key.startswith("pgk-") and "\n" not in key
    assert p.read_text().startswith(POLICY)  # the policy's text and comments kept
    pol = load_policy(p)
    kf = Path(pol.auth.keys_file or "")
    assert kf == tmp_path / "team.keys.yaml"
    stored = kf.read_text()
    assert key not in stored and hash_key(key) in stored
    assert kf.stat().st_mode & 0o077 == 0
    entry = yaml.safe_load(stored)["keys"][0]
    assert (entry["name"], entry["rpm"], entry["tpm"]) == ("ci", 60, 1000)
    assert KeyStore(pol.auth).lookup(key) is not None


def test_keys_list_shows_ids_never_keys_or_hashes_and_remove_drops_one(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(POLICY)
    run = CliRunner().invoke
    k1 = run(cli, ["keys", "add", "--policy", str(p), "--name", "alice"]).stdout.strip()
    run(cli, ["keys", "add", "--policy", str(p), "--name", "bob"])
    listed = run(cli, ["keys", "list", "--policy", str(p)]).stdout
    assert "alice" in listed and "bob" in listed
    assert k1 not in listed and "sha256:" not in listed
    assert run(cli, ["keys", "remove", "alice", "--policy", str(p)]).exit_code == 0
    pol = load_policy(p)
    assert [k.name for k in KeyStore(pol.auth).keys()] == ["bob"]
    assert KeyStore(pol.auth).lookup(k1) is None
    assert run(cli, ["keys", "remove", "alice", "--policy", str(p)]).exit_code == 1


def test_keys_add_does_not_rewrite_a_policy_with_inline_keys(tmp_path: Path) -> None:
    # not named by the issue: the command never reformats a hand-written auth section
    p = tmp_path / "p.yaml"
    text = POLICY + f"auth:\n  keys:\n    - {{id: k_hand, hash: '{hash_key('x')}'}}\n"
    p.write_text(text)
    r = CliRunner().invoke(cli, ["keys", "add", "--policy", str(p)])
    assert r.exit_code == 2 and "keys_file" in r.output
    assert p.read_text() == text


def test_policy_rejects_a_stored_key_that_is_not_a_hash() -> None:
    from prefixgate.config.loader import PolicyError

    with pytest.raises(PolicyError) as ei:
        parse_policy({"backends": {"b": {"kind": "openai_compat", "base_url": "http://x/v1"}},
                      "routes": [{"match": "*", "backend": "b"}],
                      "auth": {"keys": [{"id": "k1", "hash": "pgk-plaintext-key"}]}})
    assert ei.value.problems[0][0] == "auth.keys[0].hash"


def test_redis_guard_settles_to_exactly_the_usage() -> None:
    # issue 20 High 4 on the shared store: estimate at admission, usage at the end, no double
    import asyncio

    from prefixgate.proxy.http.auth import Guard

    client = _redis()
    prefix = f"pgtest-{uuid.uuid4().hex[:8]}:"

    async def run() -> None:
        link = RedisLink("redis://127.0.0.1:6379/0", prefix)
        clock = Clock(3_000.0)
        lim = RedisLimiter(link, clock=clock)
        guard = Guard(KeyStore(AuthSettings(keys=[ProxyKey(id="k_r", hash=hash_key("x"),
                                                           tpm=10_000)])), lim)
        body = {"model": "m", "messages": [{"role": "user", "content": "q" * 4000}]}
        ticket = await guard.limit("k_r", body, 0)
        assert ticket is not None and int(client.get(f"{prefix}rl:k_r:50:tok")) == ticket.estimate
        guard.settle(ticket, 321, 9, 200)
        guard.settle(ticket, 321, 9, 200)
        await lim.drain()
        assert int(client.get(f"{prefix}rl:k_r:50:tok")) == 330
        await link.close()

    try:
        asyncio.run(run())
    finally:
        for k in client.scan_iter(f"{prefix}*"):
            client.delete(k)
