"""Tenants: resolved from the proxy key or the header, and kept apart in session memory, the
ledger and the backend's prefix cache (``cache_salt``; the real engine's radix tree)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.cache.ledger.store import Ledger
from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import AuthSettings, Backend, LedgerSettings, ProxyKey, TenantSettings
from prefixgate.proxy.app import build_app
from prefixgate.proxy.core.errors import InvalidHeader
from prefixgate.proxy.http.auth import Guard, KeyStore, MemoryLimiter, hash_key
from prefixgate.proxy.http.salt_key import SaltKey
from prefixgate.proxy.http.tenants import namespaced_session, salted_body, tenant_for
from tests.proxy.upstream import Script, completion
from tests.servers import serve_app
from tests.tiny_model import make_tiny_model_dir, real_model_dir

LOCAL = Backend(kind="local", base_url="http://127.0.0.1:1/v1")
VLLM = Backend(kind="openai_compat", base_url="http://127.0.0.1:1/v1")
KEY_A, KEY_B = "pgk-" + "a" * 43, "pgk-" + "b" * 43
KEY = SaltKey(TenantSettings())  # the per-install secret (tests/conftest.py: a temp file)


def tenant_salt(tenant: str, client: str | None = None) -> str:
    """The keyed salt the app sends (the same secret file as the app's)."""
    return KEY.salt(tenant, client)


def _policy(header: str = "off", keys: list[ProxyKey] | None = None) -> Any:
    return parse_policy({"backends": {"x": {"kind": "local", "base_url": "http://h/v1"}},
                         "routes": [{"match": "*", "backend": "x"}],
                         "tenants": {"header": header},
                         "auth": {"keys": [k.model_dump() for k in keys or []]}})


def _guard(keys: list[ProxyKey]) -> Guard:
    return Guard(KeyStore(AuthSettings(keys=keys)), MemoryLimiter())


def test_no_keys_and_header_off_is_no_tenant() -> None:
    assert tenant_for({"x-prefixgate-tenant": "acme"}, "", _policy("off"), _guard([])) == ""


def test_header_names_the_tenant_when_the_policy_allows_it() -> None:
    assert tenant_for({"x-prefixgate-tenant": "acme"}, "", _policy("on"), _guard([])) == "acme"
    assert tenant_for({}, "", _policy("on"), _guard([])) == ""


def test_a_key_is_its_tenant_and_the_header_only_subdivides_it() -> None:
    keys = [ProxyKey(id="k_a", hash=hash_key(KEY_A), tenant="acme"),
            ProxyKey(id="k_b", hash=hash_key(KEY_B))]
    pol, guard = _policy("on", keys), _guard(keys)
    assert tenant_for({}, "k_a", pol, guard) == "acme"
    assert tenant_for({}, "k_b", pol, guard) == "k_b"  # no tenant set: the key id
    # a key holder cannot name another tenant: the header lands inside its own namespace
    assert tenant_for({"x-prefixgate-tenant": "k_b"}, "k_a", pol, guard) == "acme/k_b"
    assert tenant_for({"x-prefixgate-tenant": "x"}, "k_b", _policy("off", keys), guard) == "k_b"


@pytest.mark.parametrize("bad", ["", "a b", "a/b", "x" * 65, "é"])
def test_a_malformed_tenant_header_is_a_400_naming_it(bad: str) -> None:
    with pytest.raises(InvalidHeader) as e:
        tenant_for({"x-prefixgate-tenant": bad}, "", _policy("on"), _guard([]))
    assert e.value.status == 400 and e.value.param == "x-prefixgate-tenant"


def test_sessions_are_namespaced_by_tenant_only_when_there_is_one() -> None:
    assert namespaced_session("", "s1") == "s1"
    assert namespaced_session("a", "s1") != namespaced_session("b", "s1")


def test_salt_is_spliced_into_the_body_for_salting_backends_only() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1.10}'
    out = salted_body(raw, "acme", LOCAL, KEY)
    body = json.loads(out)
    assert body["cache_salt"] == tenant_salt("acme") and "acme" not in out.decode()
    assert out.startswith(raw[:-1]) and b'"n":1.10' in out  # the rest byte for byte
    assert salted_body(raw, "", LOCAL, KEY) is raw  # no tenant: nothing changes
    assert salted_body(raw, "acme", VLLM, KEY) is raw  # openai_compat: only when configured
    on = VLLM.model_copy(update={"cache_salt": True})
    assert json.loads(salted_body(raw, "acme", on, KEY))["cache_salt"] == tenant_salt("acme")


def test_a_clients_own_cache_salt_is_folded_in_not_dropped() -> None:
    raw = b'{"model":"m","messages":[],"cache_salt":"mine","x":12345678901234567890123}'
    body = json.loads(salted_body(raw, "acme", LOCAL, KEY))
    assert body["cache_salt"] == tenant_salt("acme", "mine") != tenant_salt("acme")
    assert body["x"] == 12345678901234567890123
    assert tenant_salt("acme", "mine") != tenant_salt("other", "mine")


def test_tenant_reaches_ledger_upstream_salt_and_session_memory(tmp_path: Path) -> None:
    """Through the real app: the upstream body carries the tenant's salt, the ledger row its
    tenant, and session memory written for one tenant is invisible to another."""
    from prefixgate.rewriter.types import Edit, RewriteResult
    from tests.proxy.upstream import ScriptedUpstream

    up = ScriptedUpstream(script=Script(body=completion()))
    views: list[dict[str, Any]] = []

    def remembering(body: Any, api: str, ctx: Any) -> RewriteResult:
        views.append(dict(ctx.session))
        return RewriteResult(body, [Edit("count", False, "params", "x",
                                         memory={"n": ctx.session.get("n", 0) + 1})])

    with serve_app(up.app()) as up_url:
        policy = parse_policy({
            "backends": {"e": {"kind": "openai_compat", "base_url": up_url + "/v1",
                               "cache_salt": True}},
            "routes": [{"match": "*", "backend": "e"}], "tenants": {"header": "on"},
            "ledger": {"path": str(tmp_path / "l.sqlite")},
            "meaning_guard": {"enabled": False}})  # its trials run the rewrite fn too (issue 36)
        ledger = Ledger(policy.ledger.path)
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        with serve_app(build_app(policy, ledger=ledger, rewrite_fn=remembering)) as url:
            for tenant in ("a", "a", "b"):
                r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                               headers={"x-prefixgate-tenant": tenant,
                                        "x-prefixgate-session": "same-session"})
                assert r.status_code == 200
            bad = httpx.post(url + "/v1/messages", json=body, timeout=30,
                             headers={"x-prefixgate-tenant": "a b"})
    assert views == [{}, {"n": 1}, {}]  # b does not see a's memory of the same session id
    salts = [s.json["cache_salt"] for s in up.seen]
    assert salts == [tenant_salt("a"), tenant_salt("a"), tenant_salt("b")]
    rows = ledger.rows()
    assert [r["tenant"] for r in rows[:3]] == ["a", "a", "b"]
    assert bad.status_code == 400 and bad.json()["type"] == "error"  # the Anthropic shape
    assert rows[3]["http_status"] == 400 and len(up.seen) == 3


def _engine_stack(model_dir: Path, tmp: Path, name: str) -> Iterator[str]:
    from prefixgate.local_engine.engine import Engine, EngineConfig
    from prefixgate.local_engine.server import build_app as engine_app

    eng = Engine(EngineConfig(model_path=str(model_dir), num_kv_slots=4096,
                              max_context_len=1024, model_name=name))
    try:
        with serve_app(engine_app(eng)) as engine_url:
            policy = parse_policy({
                "backends": {"local": {"kind": "local", "base_url": engine_url + "/v1"}},
                "routes": [{"match": "*", "backend": "local"}], "tenants": {"header": "on"},
                "ledger": LedgerSettings(path=str(tmp / "l.sqlite")).model_dump()})
            with serve_app(build_app(policy)) as url:
                yield url
    finally:
        eng.shutdown()


def _cached(url: str, tenant: str, model: str) -> int:
    msgs = [{"role": "system", "content": "You are a terse assistant for an airline. " * 8},
            {"role": "user", "content": "Which gate does flight 12 leave from?"}]
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   headers={"x-prefixgate-tenant": tenant},
                   json={"model": model, "messages": msgs, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 60
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _isolation(url: str, model: str) -> None:
    assert _cached(url, "tenant-a", model) == 0
    hit = _cached(url, "tenant-a", model)
    assert hit > 60  # a's repeat: the whole prompt but its last page from the radix tree
    assert _cached(url, "tenant-b", model) == 0  # b's first copy of a's prompt: no hit
    assert _cached(url, "tenant-b", model) == hit  # b's own repeat hits b's entry


def test_tenant_b_never_hits_tenant_a_prefix_on_the_engine(tmp_path: Path) -> None:
    """proxy -> real engine (tiny random Llama): the radix tree keys by the tenant's salt."""
    tiny = make_tiny_model_dir(tmp_path / "tiny")
    for url in _engine_stack(tiny, tmp_path, "tiny"):
        _isolation(url, "tiny")


@pytest.mark.slow
def test_tenant_isolation_on_smollm2(tmp_path: Path) -> None:
    """The same on the real SmolLM2-135M engine."""
    model = real_model_dir()
    for url in _engine_stack(model, tmp_path, "smollm2"):
        _isolation(url, "smollm2")
