"""``/v1/responses`` (bridged) and ``/v1/completions`` keep tenants apart like the chat path:
the body sent to a backend that takes a ``cache_salt`` carries the tenant's salt (two tenants
never share the engine's prefix cache), and the session id is namespaced by the tenant (the
same ``x-prefixgate-session`` from two tenants is two sessions, two ledger session hashes)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.config.schema import TenantSettings
from prefixgate.proxy.http.salt_key import SaltKey
from tests.proxy.upstream import Script, completion, wait_rows

CALLS = [("/v1/responses", {"model": "m1", "input": "hi"}),
         ("/v1/completions", {"model": "m1", "prompt": "hi", "max_tokens": 2})]


def _rig(rig_factory: Any, upstream: Any) -> Any:
    return rig_factory(tenants={"header": "on"},
                       backends={"loc": {"kind": "local", "base_url": upstream[1] + "/v1"}},
                       routes=[{"match": "*", "backend": "loc"}])


@pytest.mark.parametrize("path,body", CALLS, ids=["responses", "completions"])
def test_each_tenant_gets_its_own_cache_salt_and_session(rig_factory: Any, upstream: Any,
                                                          path: str, body: dict[str, Any]) -> None:
    rig = _rig(rig_factory, upstream)
    rig.upstream.script = Script(body=completion("ok"))
    for tenant in ("acme", "globex"):
        r = httpx.post(rig.url + path, json=body, timeout=10,
                       headers={"x-prefixgate-tenant": tenant, "x-prefixgate-session": "s1"})
        assert r.status_code == 200, r.text
        assert rig.upstream.seen[-1].json["cache_salt"] == SaltKey(TenantSettings()).salt(tenant)
    rows = wait_rows(rig.ledger, 2)
    assert [row["tenant"] for row in rows] == ["acme", "globex"]
    if path == "/v1/responses":
        assert rows[0]["session"] != rows[1]["session"]
