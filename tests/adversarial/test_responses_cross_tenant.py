"""A stored response belongs to its tenant: another tenant (another proxy key, or another
sub-tenant header) reads it exactly as an unknown id — 404 on GET and DELETE, 404 as
``previous_response_id`` (nothing sent upstream) — on a bridged backend and on an OpenAI
passthrough backend (where the proxy's one backend key would otherwise fetch anything). A
response id that is not a plain id never reaches a backend URL (``..``, ``/``, ``?``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.http.auth import hash_key
from tests.proxy.upstream import Script, completion

KEY_A = "pgk-tenant-a-0123456789abcdefghijklmnopqrstuvwxyz"
KEY_B = "pgk-tenant-b-0123456789abcdefghijklmnopqrstuvwxyz"
OAI_ANSWER = {"id": "resp_upA", "object": "response", "status": "completed", "model": "gpt-x",
              "output": [], "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}


def _rig(rig_factory: Any, upstream: Any) -> Any:
    url = upstream[1] + "/v1"
    return rig_factory(
        auth={"keys": [{"id": "k_a", "hash": hash_key(KEY_A)},
                       {"id": "k_b", "hash": hash_key(KEY_B)}]},
        tenants={"header": "on"},
        backends={"up": {"kind": "openai_compat", "base_url": url},
                  "oai": {"kind": "openai", "base_url": url}},
        routes=[{"match": "gpt-*", "backend": "oai"}, {"match": "m*", "backend": "up"}])


def _h(key: str, sub: str | None = None) -> dict[str, str]:
    h = {"authorization": f"Bearer {key}"}
    if sub:
        h["x-prefixgate-tenant"] = sub
    return h


def _create(rig: Any, model: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    rig.upstream.script = Script(body=OAI_ANSWER if model.startswith("gpt") else
                                 completion("secret of A"))
    return httpx.post(rig.url + "/v1/responses", json={"model": model, "input": "hi", **extra},
                      headers=headers, timeout=10)


@pytest.mark.parametrize("model", ["m1", "gpt-x"], ids=["bridged", "openai-passthrough"])
@pytest.mark.parametrize("other", [_h(KEY_B), _h(KEY_A, "sub"), _h(KEY_B, "k_a")],
                         ids=["other-key", "own-key-other-subtenant", "other-key-naming-a"])
def test_another_tenant_cannot_read_delete_or_continue_a_response(
        rig_factory: Any, upstream: Any, model: str, other: dict[str, str]) -> None:
    rig = _rig(rig_factory, upstream)
    r = _create(rig, model, _h(KEY_A))
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    sent = len(rig.upstream.seen)
    for method in ("GET", "DELETE"):
        got = httpx.request(method, f"{rig.url}/v1/responses/{rid}", headers=other, timeout=10)
        assert got.status_code == 404 and got.json()["error"]["code"] == "not_found"
        assert "secret" not in got.text
    follow = _create(rig, model, other, previous_response_id=rid)
    assert follow.status_code == 404
    assert follow.json()["error"]["code"] == "previous_response_not_found"
    assert len(rig.upstream.seen) == sent  # nothing reached the backend
    # the owner still has it (the other tenant's DELETE removed nothing)
    if model == "m1":
        mine = httpx.get(f"{rig.url}/v1/responses/{rid}", headers=_h(KEY_A), timeout=10)
        assert mine.status_code == 200 and "secret of A" in mine.text
        assert _create(rig, model, _h(KEY_A), previous_response_id=rid).status_code == 200


def test_with_a_tenant_an_unknown_id_is_not_fetched_from_the_openai_backend(
        rig_factory: Any, upstream: Any) -> None:
    rig = _rig(rig_factory, upstream)
    got = httpx.get(f"{rig.url}/v1/responses/resp_someone_elses", headers=_h(KEY_B), timeout=10)
    assert got.status_code == 404 and rig.upstream.seen == []


@pytest.mark.parametrize("rid", ["%2E%2E", "a%3Fx%3D1", "%00", "a%20b", "x" * 300, "%C3%A9"])
def test_an_id_that_is_not_a_plain_id_never_reaches_a_backend_url(
        rig_factory: Any, upstream: Any, rid: str) -> None:
    url = upstream[1] + "/v1"
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": url}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    for method in ("GET", "DELETE"):
        got = httpx.request(method, f"{rig.url}/v1/responses/{rid}", timeout=10)
        assert got.status_code == 404 and got.json()["error"]["code"] == "not_found"
    assert rig.upstream.seen == []
    ok = httpx.get(f"{rig.url}/v1/responses/resp_plain-id_1", timeout=10)  # a plain id still goes
    assert ok is not None and rig.upstream.seen[-1].path == "/v1/responses/resp_plain-id_1"
