"""Per-tenant upstream keys (issue 20, Medium 8): one upstream key is one provider cache, so tenant
C read 3,402 cached tokens of acme's prompt through the proxy's shared OpenAI key. With
``backends.X.tenant_keys`` a tenant's request carries its own key (its own organisation's cache);
another tenant never does; a tenant with an entry is never sent with the shared key; with
``tenant_keys_required`` a tenant without an entry is refused. The startup warning says where
tenants share a cache."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefixgate.config.loader import parse_policy
from prefixgate.config.schema import Backend
from prefixgate.proxy.core.errors import Forbidden, MissingBackendKey
from prefixgate.proxy.http.auth import hash_key
from prefixgate.proxy.http.tenants import shared_cache_warnings
from prefixgate.proxy.routing.router import Target, plan_targets, tenant_key
from tests.proxy.upstream import Script, completion

SHARED, ACME = "sk-shared-backend-key", "sk-acme-own-org-key"
PROXY_ACME, PROXY_GLOBEX = "pgk-" + "a" * 43, "pgk-" + "g" * 43


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_SHARED_KEY", SHARED)
    monkeypatch.setenv("PG_ACME_KEY", ACME)
    monkeypatch.delenv("PG_UNSET_KEY", raising=False)


def _backend(**extra: Any) -> Backend:
    return Backend(kind="openai", base_url="https://api.example.test/v1",
                   api_key="${PG_SHARED_KEY}",
                   tenant_keys={"acme": "${PG_ACME_KEY}", "initech": "${PG_UNSET_KEY}"},
                   **extra)


def _target(backend: Backend, tenant: str) -> Target:
    return Target("*", "oa", backend, "openai", "openai", False, tenant=tenant)


def test_each_tenant_gets_its_own_key_and_only_its_own() -> None:
    b = _backend()
    assert _target(b, "acme").api_key() == ACME
    assert _target(b, "acme/team-a").api_key() == ACME  # a sub-tenant: its base tenant's key
    assert _target(b, "globex").api_key() == SHARED  # no entry: the shared key
    assert _target(b, "").api_key() == SHARED  # no tenant
    assert _target(b, "acmex").api_key() == SHARED  # a name that only starts like acme
    assert tenant_key(b, "globex/acme") is None  # the sub-tenant part never selects a key


def test_a_tenant_whose_key_is_unset_is_refused_never_sent_with_the_shared_key() -> None:
    with pytest.raises(MissingBackendKey) as e:
        _target(_backend(), "initech").api_key()
    assert e.value.status == 424 and SHARED not in e.value.message


def test_required_tenant_keys_refuse_a_tenant_without_one() -> None:
    b = _backend(tenant_keys_required=True)
    with pytest.raises(Forbidden) as e:
        _target(b, "globex").api_key()
    assert e.value.status == 403 and "acme" not in e.value.message  # names no other tenant
    assert _target(b, "acme").api_key() == ACME
    assert _target(b, "").api_key() == SHARED  # no tenant: not affected


def test_the_tenant_survives_the_choice_of_a_deployment() -> None:
    policy = parse_policy({"backends": {"oa": {
        "kind": "openai", "api_key": "${PG_SHARED_KEY}", "tenant_keys": {"acme": "${PG_ACME_KEY}"},
        "deployments": [{"base_url": "https://a.example.test/v1"},
                        {"base_url": "https://b.example.test/v1", "api_key": "${PG_UNSET_KEY}"}]}},
        "routes": [{"match": "*", "backend": "oa"}]})
    t = plan_targets(policy, "gpt-4o", "openai", tenant="acme")[0]
    deps = policy.backends["oa"].group("oa")
    assert [t.on(d).api_key() for d in deps] == [ACME, ACME]  # on every deployment


@pytest.mark.parametrize("bad", [{"acme": "sk-literal"}, {"a b": "${X}"}, {"a/b/c": "${X}"}])
def test_tenant_keys_are_env_references_of_tenant_names(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Backend(kind="openai", base_url="https://x.test/v1", tenant_keys=bad)


def test_through_the_proxy_the_upstream_sees_each_tenants_own_key(rig_factory: Any,
                                                                   upstream: Any) -> None:
    up, up_url = upstream
    keys = [{"id": "k_acme", "tenant": "acme", "hash": hash_key(PROXY_ACME)},
            {"id": "k_globex", "tenant": "globex", "hash": hash_key(PROXY_GLOBEX)}]
    rig = rig_factory(tenants={"header": "on"}, auth={"keys": keys}, backends={
        "up": {"kind": "openai_compat", "base_url": up_url + "/v1", "api_key": "${PG_SHARED_KEY}",
               "tenant_keys": {"acme": "${PG_ACME_KEY}"}}},
        routes=[{"match": "*", "backend": "up"}])
    up.script = Script(body=completion())
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    for proxy_key, sub in ((PROXY_ACME, None), (PROXY_GLOBEX, None), (PROXY_ACME, "team-a"),
                           (PROXY_GLOBEX, "acme")):  # globex naming "acme": globex/acme
        headers = {"authorization": f"Bearer {proxy_key}"}
        if sub:
            headers["x-prefixgate-tenant"] = sub
        r = httpx.post(rig.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert r.status_code == 200, r.text
    sent = [s.headers["authorization"] for s in up.seen]
    assert sent == [f"Bearer {ACME}", f"Bearer {SHARED}", f"Bearer {ACME}", f"Bearer {SHARED}"]
    rows = rig.ledger.rows()
    assert all(ACME not in str(r) and SHARED not in str(r) for r in rows)  # never stored


def test_startup_warns_where_tenants_share_a_cache(rig_factory: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="prefixgate.proxy")
    rig_factory(tenants={"header": "on"})
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tenants:")]
    assert any("'anth'" in m and "tenant_keys" in m and "provider" in m for m in said)
    assert any("'up'" in m and "cache_salt: true" in m for m in said)
    assert all(SHARED not in m and "sk-ant" not in m for m in said)


def test_no_warning_where_tenants_cannot_meet_or_are_kept_apart() -> None:
    base: dict[str, Any] = {"routes": [{"match": "*", "backend": "oa"}]}
    hosted = {"kind": "openai", "base_url": "https://x.test/v1", "api_key": "${PG_SHARED_KEY}"}
    alone = parse_policy({**base, "backends": {"oa": hosted}})
    assert shared_cache_warnings(alone) == []  # no tenants at all
    isolated = parse_policy({**base, "tenants": {"header": "on"}, "backends": {"oa": {
        **hosted, "tenant_keys": {"acme": "${PG_ACME_KEY}"}, "tenant_keys_required": True}}})
    assert shared_cache_warnings(isolated) == []
    partly = parse_policy({**base, "tenants": {"header": "on"}, "backends": {"oa": {
        **hosted, "tenant_keys": {"acme": "${PG_ACME_KEY}"}}}})
    [line] = shared_cache_warnings(partly)
    assert "tenants without an entry in tenant_keys" in line
    salted = parse_policy({**base, "tenants": {"header": "on"}, "backends": {"oa": {
        "kind": "openai_compat", "base_url": "http://e.test/v1", "cache_salt": True}}})
    assert shared_cache_warnings(salted) == []


def test_docs_say_it_plainly(tmp_path: Path) -> None:
    del tmp_path
    readme = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()  # moved from README
    section = readme.split("## Tenants", 1)[1].split("\n## ", 1)[0]
    assert "one upstream key" in section and "tenant_keys" in section
    assert "tenant_keys_required" in section and "salt_secret" in section


def test_through_the_proxy_a_refused_tenant_sends_nothing(rig_factory: Any, upstream: Any) -> None:
    """``tenant_keys_required``: a tenant without a key is a 403 in the caller's shape (the
    Anthropic shape on /v1/messages); a tenant whose key variable is unset a 424; neither
    reaches the upstream with the shared key."""
    up, up_url = upstream
    rig = rig_factory(tenants={"header": "on"}, backends={
        "up": {"kind": "openai_compat", "base_url": up_url + "/v1", "api_key": "${PG_SHARED_KEY}",
               "tenant_keys": {"acme": "${PG_ACME_KEY}", "initech": "${PG_UNSET_KEY}"},
               "tenant_keys_required": True}},
        routes=[{"match": "*", "backend": "up"}])
    up.script = Script(body=completion())
    chat = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    globex = httpx.post(rig.url + "/v1/chat/completions", json=chat, timeout=10,
                        headers={"x-prefixgate-tenant": "globex"})
    anth = httpx.post(rig.url + "/v1/messages", json={**chat, "max_tokens": 5}, timeout=10,
                      headers={"x-prefixgate-tenant": "globex"})
    initech = httpx.post(rig.url + "/v1/chat/completions", json=chat, timeout=10,
                         headers={"x-prefixgate-tenant": "initech"})
    acme = httpx.post(rig.url + "/v1/chat/completions", json=chat, timeout=10,
                      headers={"x-prefixgate-tenant": "acme"})
    assert globex.status_code == 403 and globex.json()["error"]["type"] == "permission_error"
    assert anth.status_code == 403 and anth.json()["error"]["type"] == "permission_error"
    assert initech.status_code == 424 and "PG_UNSET_KEY" in initech.text
    assert acme.status_code == 200
    assert [s.headers["authorization"] for s in up.seen] == [f"Bearer {ACME}"]
