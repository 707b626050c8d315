"""The tenants' ``cache_salt`` is keyed by a proxy secret (issue 20, Medium 8): nobody without the
secret can compute a tenant's salt (the unkeyed hash let anyone reaching the engine port read
acme's cache with ``/v1/cache/match``), and with no usable secret a tenant's request to a salted
backend is refused, never sent unsalted (:mod:`prefixgate.proxy.http.salt_key`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import Backend, TenantSettings
from prefixgate.proxy.app import build_app
from prefixgate.proxy.core.errors import TenantSaltUnavailable
from prefixgate.proxy.http import salt_key
from prefixgate.proxy.http.salt_key import SaltKey, keyed_salt
from prefixgate.proxy.http.tenants import salted_body, tenant_salt
from tests.proxy.upstream import Script, ScriptedUpstream, completion, wait_rows
from tests.servers import serve_app

LOCAL = Backend(kind="local", base_url="http://127.0.0.1:1/v1")
RAW = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
SECRET = "s" * 40


def _file_key(tmp_path: Path) -> SaltKey:
    return SaltKey(TenantSettings(), path=tmp_path / "k" / "tenant_salt.key")


def test_the_salt_is_an_hmac_of_the_tenant_not_a_hash_anyone_can_compute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_SALT", SECRET)
    key = SaltKey(TenantSettings(salt_secret="${PG_SALT}"))
    salt = key.salt("acme")
    expected = hmac.new(SECRET.encode(), b"prefixgate-tenant-salt|v1|acme", hashlib.sha256)
    assert salt == expected.hexdigest()
    unkeyed = {hashlib.sha256(s.encode()).hexdigest() for s in
               ("acme", "prefixgate-tenant|acme", "prefixgate-tenant-salt|v1|acme")}
    assert salt not in unkeyed and salt != tenant_salt("acme")  # the old wire salt
    assert salt != keyed_salt(b"t" * 40, "acme")  # another secret, another salt
    assert key.salt("acme", "mine") not in (salt, key.salt("other", "mine"))  # client folded
    wire = json.loads(salted_body(RAW, "acme", LOCAL, key))["cache_salt"]
    assert wire == salt and "acme" not in json.dumps(wire)


def test_the_generated_secret_file_is_private_and_stable(tmp_path: Path) -> None:
    a = _file_key(tmp_path)
    salt = a.salt("acme")
    path = tmp_path / "k" / "tenant_salt.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text().strip()) == 64
    assert _file_key(tmp_path).salt("acme") == salt  # a restart (another worker): same salt
    other = SaltKey(TenantSettings(), path=tmp_path / "other.key")
    assert other.salt("acme") != salt  # another install: another secret
    assert [p.name for p in path.parent.iterdir()] == ["tenant_salt.key"]  # no temp left


def test_workers_creating_the_file_at_once_all_get_the_one_secret(tmp_path: Path) -> None:
    got: list[str] = []
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        got.append(_file_key(tmp_path).salt("acme"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1


@pytest.mark.parametrize("spoil", ["group_readable", "not_hex", "short", "symlink", "folder"])
def test_an_unfit_secret_file_is_refused_not_replaced(tmp_path: Path, spoil: str) -> None:
    path = tmp_path / "k" / "tenant_salt.key"
    path.parent.mkdir(mode=0o700)
    content = "ab" * 32 + "\n"
    if spoil == "folder":
        path.mkdir()
    elif spoil == "symlink":
        real = tmp_path / "real.key"
        real.write_text(content)
        real.chmod(0o600)
        path.symlink_to(real)
    else:
        path.write_text({"not_hex": "zz" * 32, "short": "ab" * 16}.get(spoil, content))
        path.chmod(0o640 if spoil == "group_readable" else 0o600)
    before = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    key = SaltKey(TenantSettings(), path=path)
    with pytest.raises(TenantSaltUnavailable) as e:
        key.salt("acme")
    assert e.value.status == 424 and str(path) not in e.value.message
    assert key.reasons() and str(path) not in key.reasons()[0]
    if before is not None:
        assert path.read_bytes() == before  # never overwritten


@pytest.mark.parametrize("value", [None, "", "short-secret"])
def test_a_configured_secret_that_is_unset_or_short_fails_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("PG_SALT", raising=False)
    else:
        monkeypatch.setenv("PG_SALT", value)
    key = SaltKey(TenantSettings(salt_secret="${PG_SALT}"), path=tmp_path / "f.key")
    with pytest.raises(TenantSaltUnavailable):
        salted_body(RAW, "acme", LOCAL, key)
    assert not (tmp_path / "f.key").exists()  # no silent fall back to a per-host file
    assert salted_body(RAW, "", LOCAL, key) is RAW  # no tenant: nothing is due


def test_a_secret_fixed_later_is_picked_up_after_the_retry_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.delenv("PG_SALT", raising=False)
    key = SaltKey(TenantSettings(salt_secret="${PG_SALT}"), clock=lambda: now[0])
    assert key.key() is None and key.reasons()
    monkeypatch.setenv("PG_SALT", SECRET)
    assert key.key() is None  # not retried within RETRY_S
    now[0] += salt_key.RETRY_S
    assert key.key() == SECRET.encode() and key.reasons() == []


def test_the_secret_is_never_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("PG_SALT", "x" * 10)
    SaltKey(TenantSettings(salt_secret="${PG_SALT}")).key()
    key = _file_key(tmp_path)
    key.key()
    secret_hex = (tmp_path / "k" / "tenant_salt.key").read_text().strip()
    assert "PG_SALT" in caplog.text  # the log says what to fix
    assert "x" * 10 not in caplog.text and secret_hex not in caplog.text


def _salted_policy(up_url: str, tmp_path: Path, **tenants: Any) -> Any:
    return parse_policy({
        "backends": {"e": {"kind": "local", "base_url": up_url + "/v1"},
                     "plain": {"kind": "openai_compat", "base_url": up_url + "/v1"}},
        "routes": [{"match": "plain*", "backend": "plain", "fallbacks": ["e"]},
                   {"match": "*", "backend": "e", "fallbacks": ["plain"]}],
        "tenants": {"header": "on", **tenants},
        "ledger": {"path": str(tmp_path / "l.sqlite")}})


def test_through_the_app_no_secret_means_no_tenant_request_reaches_a_salted_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_SALT", raising=False)
    up = ScriptedUpstream(script=Script(status=500, body={"error": {"message": "down"}}))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with serve_app(up.app()) as up_url:
        policy = _salted_policy(up_url, tmp_path, salt_secret="${PG_SALT}")
        ledger = Ledger(tmp_path / "l.sqlite")
        with serve_app(build_app(policy, ledger=ledger)) as url:
            refused = httpx.post(url + "/v1/chat/completions", json=body, timeout=10,
                                 headers={"x-prefixgate-tenant": "acme"})
            health = httpx.get(url + "/healthz", timeout=10)
            # a tenant to a non-salted primary: sent, but its salted fallback is left out
            plain = httpx.post(url + "/v1/chat/completions", timeout=10,
                               json={**body, "model": "plain-1"},
                               headers={"x-prefixgate-tenant": "acme"})
            up.script = Script(body=completion())
            no_tenant = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    assert refused.status_code == 424
    assert refused.json()["error"]["code"] == "tenant_salt_unavailable"
    assert "PG_SALT" not in refused.text
    assert health.status_code == 503 and any("salt" in r for r in health.json()["reasons"])
    assert plain.status_code == 500  # the plain backend's own error: no fallback to e
    assert no_tenant.status_code == 200  # no tenant: no salt due
    sent = [s.json for s in up.seen]
    assert all("cache_salt" not in s for s in sent)
    assert [s["model"] for s in sent].count("m") == 1  # only the request without a tenant
    rows = wait_rows(ledger, 3)
    plain_row = next(r for r in rows if r["model"] == "plain-1")
    assert "e:tenant-salt-unavailable" in plain_row["attempt_reasons"]


def test_through_the_app_the_engine_gets_the_keyed_salt(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_SALT", SECRET)
    up = ScriptedUpstream(script=Script(body=completion()))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with serve_app(up.app()) as up_url:
        policy = _salted_policy(up_url, tmp_path, salt_secret="${PG_SALT}")
        with serve_app(build_app(policy, ledger=Ledger(tmp_path / "l.sqlite"))) as url:
            for tenant in ("acme", "globex"):
                r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10,
                               headers={"x-prefixgate-tenant": tenant})
                assert r.status_code == 200
    assert [s.json["cache_salt"] for s in up.seen] == [
        keyed_salt(SECRET.encode(), "acme"), keyed_salt(SECRET.encode(), "globex")]
    assert os.environ["PG_SALT"] not in json.dumps([s.json for s in up.seen])
