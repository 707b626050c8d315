"""``/v1/responses`` endpoint rules, point by point (issue 21): the body checks (400s naming the
field), what is stored and what is not, GET / DELETE of a stored response, a pointer to an OpenAI
backend forwarded, an unknown id forwarded only to the one OpenAI backend whose key is set.

Rules: :mod:`prefixgate.proxy.api.responses` docstring. The body checks are a pure function; the
rest runs a proxy in front of the scripted upstream (``tests/proxy/conftest.py``).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from prefixgate.proxy.api.responses import MAX_OUTPUT_TOKENS, check_body
from prefixgate.proxy.core.errors import InvalidRequest
from tests.proxy.upstream import Script, completion, wait_rows

OAI = {"id": "resp_up1", "object": "response", "status": "completed", "model": "gpt-x",
       "output": [], "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}


# ---- body checks ------------------------------------------------------------------------------

def bad(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        check_body(body)
    assert err.value.status == 400
    return err.value


def test_model_is_required_and_a_string() -> None:
    e = bad({"input": "hi"})
    assert (e.param, e.code, e.message) == ("model", "missing_required_parameter",
                                            "Missing required parameter: 'model'.")
    for model in (None, 3, ["m"]):
        e = bad({"model": model, "input": "hi"})
        assert (e.param, e.code, e.message) == ("model", "invalid_type",
                                                "Invalid type for 'model': expected a string.")


@pytest.mark.parametrize("inp", [None, 3, {"role": "user"}])
def test_input_is_a_string_or_an_array(inp: Any) -> None:
    body = {"model": "m"} if inp is None else {"model": "m", "input": inp}
    e = bad(body)
    assert (e.param, e.code, e.message) == ("input", "invalid_type",
                                            "'input' must be a string or an array of input items.")


@pytest.mark.parametrize("key", ["stream", "store"])
def test_stream_and_store_are_booleans(key: str) -> None:
    for value in ("true", 1, 0):
        e = bad({"model": "m", "input": "hi", key: value})
        assert (e.param, e.code, e.message) == (key, "invalid_type",
                                                f"Invalid type for '{key}': expected a boolean.")
    check_body({"model": "m", "input": [], key: None})
    check_body({"model": "m", "input": [], key: False})


@pytest.mark.parametrize("cap", [0, -1, MAX_OUTPUT_TOKENS + 1, True, "5", 1.5])
def test_max_output_tokens_out_of_range_or_not_an_integer_is_a_400(cap: Any) -> None:
    e = bad({"model": "m", "input": "hi", "max_output_tokens": cap})
    assert (e.param, e.code) == ("max_output_tokens", "invalid_value")
    assert e.message == "Invalid 'max_output_tokens': expected an integer from 1 to 2147483647."


@pytest.mark.parametrize("cap", [1, 2**31 - 1, None])
def test_max_output_tokens_in_range_passes(cap: Any) -> None:
    assert MAX_OUTPUT_TOKENS == 2**31 - 1
    check_body({"model": "m", "input": "hi", "max_output_tokens": cap})


def test_previous_response_id_is_a_string() -> None:
    e = bad({"model": "m", "input": "hi", "previous_response_id": 7})
    assert (e.param, e.code, e.message) == ("previous_response_id", "invalid_type",
                                            "Invalid type for 'previous_response_id': expected a string.")
    check_body({"model": "m", "input": "hi", "previous_response_id": None})


# ---- bridged: stored, read, continued, deleted ------------------------------------------------

def create(rig: Any, **body: Any) -> httpx.Response:
    return httpx.post(rig.url + "/v1/responses", json={"model": "m1", "input": "hi", **body}, timeout=10)


def test_a_bridged_response_is_stored_read_continued_and_deleted(rig: Any) -> None:
    rig.upstream.script = Script(body=completion("first"))
    r = httpx.post(rig.url + "/v1/responses", content=b'{"model": "m1", "input": "one", "temperature": 0.70}',
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 200 and b'"temperature":0.70' in r.content
    rid = r.json()["id"]
    got = httpx.get(f"{rig.url}/v1/responses/{rid}", timeout=10)
    assert got.status_code == 200 and got.json() == r.json()
    assert got.headers["content-type"] == "application/json"
    assert got.content == r.content  # stored as exact JSON: 0.70 stays 0.70
    bare = httpx.get(f"{rig.url}/responses/{rid}", timeout=10)  # served without /v1 too
    assert bare.status_code == 200 and bare.json()["id"] == rid
    rig.upstream.script = Script(body=completion("second"))
    follow = create(rig, input="two", previous_response_id=rid)
    assert follow.status_code == 200
    assert rig.upstream.seen[-1].json["messages"] == [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "first"},
        {"role": "user", "content": "two"}]
    sent = len(rig.upstream.seen)
    d = httpx.delete(f"{rig.url}/v1/responses/{rid}", timeout=10)
    assert d.status_code == 200 and d.json() == {"id": rid, "object": "response.deleted", "deleted": True}
    gone = httpx.get(f"{rig.url}/v1/responses/{rid}", timeout=10)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert gone.json()["error"]["param"] == "response_id"
    assert gone.json()["error"]["message"] == f"No response found with id '{rid}'."
    again = create(rig, input="three", previous_response_id=rid)
    assert again.status_code == 404
    err = again.json()["error"]
    assert (err["code"], err["param"]) == ("previous_response_not_found", "previous_response_id")
    assert err["message"] == f"Previous response with id '{rid}' not found."
    assert len(rig.upstream.seen) == sent  # neither the GETs nor the 404 reached the backend
    assert httpx.get(f"{rig.url}/v1/responses/{follow.json()['id']}", timeout=10).status_code == 200


def test_each_create_is_one_ledger_row_of_the_responses_endpoint(rig: Any) -> None:
    rig.upstream.script = Script(body=completion("x"))
    assert create(rig).status_code == 200
    rig.upstream.script = Script(body=completion("y"))
    assert httpx.post(rig.url + "/responses", json={"model": "m1", "input": "hi"}, timeout=10).status_code == 200
    rows = wait_rows(rig.ledger, 2)
    assert [r["endpoint"] for r in rows] == ["/v1/responses", "/v1/responses"]  # the bare path is served as /v1


def test_store_false_keeps_nothing(rig: Any) -> None:
    rig.upstream.script = Script(body=completion("x"))
    r = create(rig, store=False)
    assert r.status_code == 200 and r.json()["store"] is False
    assert httpx.get(f"{rig.url}/v1/responses/{r.json()['id']}", timeout=10).status_code == 404
    assert create(rig, previous_response_id=r.json()["id"]).status_code == 404


def test_an_unknown_post_under_responses_is_a_404_in_openai_shape(rig: Any) -> None:
    r = httpx.post(rig.url + "/v1/responses/compact", json={}, timeout=10)
    assert r.status_code == 404 and rig.upstream.seen == []
    assert r.json() == {"error": {"message": "Invalid URL (POST /v1/responses/compact)",
                                  "type": "invalid_request_error", "param": None, "code": "unknown_url"}}


# ---- an OpenAI backend: pointers and forwarding -----------------------------------------------

def oai_rig(rig_factory: Any, upstream: Any, **backend: Any) -> Any:
    url = upstream[1] + "/v1"
    return rig_factory(backends={"oai": {"kind": "openai", "base_url": url, **backend},
                                 "up": {"kind": "openai_compat", "base_url": url}},
                       routes=[{"match": "gpt-*", "backend": "oai"}, {"match": "m*", "backend": "up"}])


def test_a_pointer_forwards_get_and_delete_to_its_backend_with_its_key(
        rig_factory: Any, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_TEST_OAI_KEY", "sk-oai-backend")
    rig = oai_rig(rig_factory, upstream, api_key="${PG_TEST_OAI_KEY}")
    rig.upstream.script = Script(body=OAI)
    assert create(rig, model="gpt-x").json()["id"] == "resp_up1"
    rig.upstream.script = Script(body={**OAI, "status": "in_store"}, status=203,
                                 headers={"x-request-id": "req_42", "set-cookie": "a=b"})
    got = httpx.get(f"{rig.url}/v1/responses/resp_up1", timeout=10)
    assert got.status_code == 203 and got.json()["status"] == "in_store"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-request-id"] == "req_42" and "set-cookie" not in got.headers
    seen = rig.upstream.seen[-1]
    assert seen.path == "/v1/responses/resp_up1" and seen.headers["authorization"] == "Bearer sk-oai-backend"
    rig.upstream.script = Script(body={"id": "resp_up1", "object": "response.deleted", "deleted": True})
    d = httpx.delete(f"{rig.url}/v1/responses/resp_up1", timeout=10)
    assert d.status_code == 200 and d.json()["deleted"] is True and rig.upstream.seen[-1].path == "/v1/responses/resp_up1"


def test_a_pointer_cannot_continue_on_a_bridged_backend(rig_factory: Any, upstream: Any) -> None:
    rig = oai_rig(rig_factory, upstream)
    rig.upstream.script = Script(body=OAI)
    create(rig, model="gpt-x")
    sent = len(rig.upstream.seen)
    r = create(rig, model="m1", previous_response_id="resp_up1")
    assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
    assert len(rig.upstream.seen) == sent


def test_store_false_on_an_openai_backend_keeps_no_pointer(rig_factory: Any, upstream: Any) -> None:
    url = upstream[1] + "/v1"
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": url},
                                "oai2": {"kind": "openai", "base_url": url + "/other"}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    rig.upstream.script = Script(body=OAI)
    assert create(rig, model="gpt-x", store=False).status_code == 200
    sent = len(rig.upstream.seen)
    # two OpenAI backends: an id without a pointer cannot be placed, so it is a 404, not a guess
    assert httpx.get(f"{rig.url}/v1/responses/resp_up1", timeout=10).status_code == 404
    assert httpx.delete(f"{rig.url}/v1/responses/resp_up1", timeout=10).status_code == 404
    assert len(rig.upstream.seen) == sent
    rig.upstream.script = Script(body=OAI)
    assert create(rig, model="gpt-x").status_code == 200  # stored: a pointer to "oai"
    rig.upstream.script = Script(body=OAI)
    assert httpx.get(f"{rig.url}/v1/responses/resp_up1", timeout=10).status_code == 200
    assert rig.upstream.seen[-1].path == "/v1/responses/resp_up1"


def test_an_unknown_id_goes_to_the_one_openai_backend_only_when_its_key_is_set(
        rig_factory: Any, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PG_TEST_UNSET_KEY", raising=False)
    rig = oai_rig(rig_factory, upstream, api_key="${PG_TEST_UNSET_KEY}")
    r = httpx.get(f"{rig.url}/v1/responses/resp_elsewhere", timeout=10)
    assert r.status_code == 404 and rig.upstream.seen == []
    rig2 = oai_rig(rig_factory, upstream)
    rig2.upstream.script = Script(body={"error": {"message": "No response"}}, status=404)
    r = httpx.get(f"{rig2.url}/v1/responses/resp_elsewhere", timeout=10)
    assert r.status_code == 404 and rig2.upstream.seen[-1].path == "/v1/responses/resp_elsewhere"


def test_an_unreachable_openai_backend_is_a_shaped_upstream_error(rig_factory: Any) -> None:
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                                        "timeout_s": 2}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    r = httpx.get(f"{rig.url}/v1/responses/resp_x", timeout=10)
    assert r.status_code in (502, 503)
    assert r.json()["error"]["message"].startswith("upstream 'oai' unreachable (Connect")


def test_a_bad_proxy_key_is_refused_on_get_and_delete(rig_factory: Any) -> None:
    from prefixgate.proxy.http.auth import hash_key

    rig = rig_factory(auth={"keys": [{"id": "k", "hash": hash_key("pgk-" + "a" * 40)}]})
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{rig.url}/v1/responses/resp_1",
                          headers={"authorization": "Bearer pgk-wrong"}, timeout=10)
        assert r.status_code == 401 and "error" in r.json()


def test_a_tenants_pointer_is_fetched_with_the_tenants_own_upstream_key(
        rig_factory: Any, upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant with its own key for the OpenAI backend reads its response with that key (one
    upstream key is one organisation's store); with the key's variable gone, a 424 naming the
    backend, never the shared key instead."""
    monkeypatch.setenv("PG_TEST_OAI_KEY", "sk-shared")
    monkeypatch.setenv("PG_TEST_ACME_KEY", "sk-acme-own")
    url = upstream[1] + "/v1"
    rig = rig_factory(tenants={"header": "on"},
                      backends={"oai": {"kind": "openai", "base_url": url, "api_key": "${PG_TEST_OAI_KEY}",
                                        "tenant_keys": {"acme": "${PG_TEST_ACME_KEY}"}}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    acme = {"x-prefixgate-tenant": "acme"}
    rig.upstream.script = Script(body=OAI)
    r = httpx.post(rig.url + "/v1/responses", json={"model": "gpt-x", "input": "hi"}, headers=acme, timeout=10)
    assert r.status_code == 200 and rig.upstream.seen[-1].headers["authorization"] == "Bearer sk-acme-own"
    got = httpx.get(f"{rig.url}/v1/responses/resp_up1", headers=acme, timeout=10)
    assert got.status_code == 200
    assert rig.upstream.seen[-1].path == "/v1/responses/resp_up1"
    assert rig.upstream.seen[-1].headers["authorization"] == "Bearer sk-acme-own"
    monkeypatch.delenv("PG_TEST_ACME_KEY")
    sent = len(rig.upstream.seen)
    gone = httpx.get(f"{rig.url}/v1/responses/resp_up1", headers=acme, timeout=10)
    assert gone.status_code == 424 and "backend 'oai'" in gone.json()["error"]["message"]
    assert len(rig.upstream.seen) == sent


def test_a_forwarded_get_gives_up_at_the_backends_timeout(rig_factory: Any, upstream: Any) -> None:
    url = upstream[1] + "/v1"
    rig = rig_factory(backends={"oai": {"kind": "openai", "base_url": url, "timeout_s": 0.3}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    rig.upstream.script = Script(pieces=[b"{}"], delay_s=1.5, media_type="application/json")
    r = httpx.get(f"{rig.url}/v1/responses/resp_slow", timeout=10)
    assert r.status_code in (502, 503, 504)
    assert "unreachable (ReadTimeout)" in r.json()["error"]["message"]


def test_a_tenant_continues_its_own_openai_response_and_another_gets_a_404_naming_it(
        rig_factory: Any, upstream: Any) -> None:
    url = upstream[1] + "/v1"
    rig = rig_factory(tenants={"header": "on"}, backends={"oai": {"kind": "openai", "base_url": url}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    acme, globex = {"x-prefixgate-tenant": "acme"}, {"x-prefixgate-tenant": "globex"}
    rig.upstream.script = Script(body=OAI)
    body = {"model": "gpt-x", "input": "hi"}
    assert httpx.post(rig.url + "/v1/responses", json=body, headers=acme, timeout=10).status_code == 200
    rig.upstream.script = Script(body={**OAI, "id": "resp_up2"})
    follow = httpx.post(rig.url + "/v1/responses", json={**body, "previous_response_id": "resp_up1"},
                        headers=acme, timeout=10)
    assert follow.status_code == 200 and rig.upstream.seen[-1].json["previous_response_id"] == "resp_up1"
    other = httpx.post(rig.url + "/v1/responses", json={**body, "previous_response_id": "resp_up1"},
                       headers=globex, timeout=10)
    assert other.status_code == 404
    assert other.json()["error"]["message"] == "Previous response with id 'resp_up1' not found."


async def test_a_forward_while_the_upstream_client_is_down_is_a_503() -> None:
    from types import SimpleNamespace

    from prefixgate.cache.state.responses_store import MemoryResponseStore
    from prefixgate.config.loader import parse_policy
    from prefixgate.proxy.api.responses import ResponsesEndpoint
    from prefixgate.proxy.core.errors import UpstreamUnavailable

    policy = parse_policy({"backends": {"oai": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
                           "routes": [{"match": "*", "backend": "oai"}]})
    state = SimpleNamespace(policy=policy, upstream=SimpleNamespace(client=None))
    ep = ResponsesEndpoint(state, MemoryResponseStore())  # type: ignore[arg-type]
    with pytest.raises(UpstreamUnavailable) as err:
        await ep._forward(SimpleNamespace(headers={}), "oai", "resp_1", "GET", "")  # type: ignore[arg-type]
    assert err.value.message == "the upstream client is not running"


def test_on_an_anthropic_backend_the_bridge_speaks_messages(rig: Any) -> None:
    rig.upstream.script = Script(body={
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "Bonjour"}], "usage": {"input_tokens": 5, "output_tokens": 1}})
    r = create(rig, model="claude-x", input="Hello in French")
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Bonjour"
    assert rig.upstream.seen[-1].path == "/v1/messages"


def test_reading_a_response_is_not_counted_against_the_keys_request_rate(rig_factory: Any) -> None:
    from prefixgate.proxy.http.auth import hash_key

    key = "pgk-" + "r" * 40
    rig = rig_factory(auth={"keys": [{"id": "k", "hash": hash_key(key), "rpm": 1}]})
    for _ in range(3):
        r = httpx.get(f"{rig.url}/v1/responses/resp_none", headers={"authorization": f"Bearer {key}"}, timeout=10)
        assert r.status_code == 404


def test_deleting_a_tenants_pointer_forgets_it(rig_factory: Any, upstream: Any) -> None:
    url = upstream[1] + "/v1"
    rig = rig_factory(tenants={"header": "on"}, backends={"oai": {"kind": "openai", "base_url": url}},
                      routes=[{"match": "gpt-*", "backend": "oai"}])
    acme = {"x-prefixgate-tenant": "acme"}
    rig.upstream.script = Script(body=OAI)
    httpx.post(rig.url + "/v1/responses", json={"model": "gpt-x", "input": "hi"}, headers=acme, timeout=10)
    rig.upstream.script = Script(body={"id": "resp_up1", "object": "response.deleted", "deleted": True})
    assert httpx.delete(f"{rig.url}/v1/responses/resp_up1", headers=acme, timeout=10).status_code == 200
    sent = len(rig.upstream.seen)
    assert httpx.get(f"{rig.url}/v1/responses/resp_up1", headers=acme, timeout=10).status_code == 404
    assert len(rig.upstream.seen) == sent  # the pointer is gone: nothing is forwarded


def test_install_serves_the_store_it_is_given() -> None:
    from types import SimpleNamespace

    from fastapi import FastAPI

    from prefixgate.cache.state.responses_store import MemoryResponseStore
    from prefixgate.proxy.api.responses import install

    app, store = FastAPI(), MemoryResponseStore()
    assert install(app, SimpleNamespace(), store) is store and app.state.responses is store  # type: ignore[arg-type]
    default = install(FastAPI(), SimpleNamespace())  # type: ignore[arg-type]
    assert isinstance(default, MemoryResponseStore) and default is not store


def test_the_openapi_document_lists_get_and_delete_of_a_response_but_no_post(rig: Any) -> None:
    paths = httpx.get(rig.url + "/openapi.json", timeout=10).json()["paths"]
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert set(paths["/v1/responses"]) == {"post"}


def test_a_backend_id_that_is_not_a_plain_id_is_never_looked_up_nor_forwarded(
        rig_factory: Any, upstream: Any) -> None:
    rig = oai_rig(rig_factory, upstream)
    rig.upstream.script = Script(body={**OAI, "id": "x y?z=1"})
    assert create(rig, model="gpt-x").status_code == 200
    sent = len(rig.upstream.seen)
    for method in ("GET", "DELETE"):
        r = httpx.request(method, f"{rig.url}/v1/responses/x%20y%3Fz%3D1", timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert len(rig.upstream.seen) == sent
