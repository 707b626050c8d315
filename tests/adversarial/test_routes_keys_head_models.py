"""Issue 20, low items, each as its class: every route but ``/healthz`` and ``/metrics`` needs a
key when keys are configured (``/openapi.json`` did not); HEAD is answered wherever GET is
(``/api/savings`` and ``/v1/responses/{id}`` were 405); ``GET /v1/models`` is rate-limited and
its live listings are reused for 10 s per backend (it asked every backend on every call)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from fastapi.routing import APIRoute

from prefixgate.config.loader import parse_policy
from prefixgate.proxy.api.models import LISTING_TTL_S, MAX_LISTED, Listings, list_models
from prefixgate.proxy.app import build_app
from prefixgate.proxy.http.auth import hash_key

KEY = "pgk-test-key-one-0123456789abcdefghijklmnopqrstu"
OPEN = {"/healthz", "/metrics"}
"""The routes served without a key (probes and Prometheus scrapers carry none)."""


def _keys(**limits: Any) -> dict[str, Any]:
    return {"keys": [{"id": "k_one", "hash": hash_key(KEY), **limits}]}


def _concrete(path: str) -> str:
    """A route path with each ``{param}`` / ``{param:path}`` replaced by ``x``."""
    return re.sub(r"\{[^}]+\}", "x", path)


def _routes(app: Any) -> list[tuple[str, str]]:
    """Every (path, method) the app serves: its API routes and any plain Starlette route
    (FastAPI's own ``/openapi.json`` was one)."""
    return sorted({(r.path, m) for r in app.router.routes
                   if isinstance(r, APIRoute) or getattr(r, "methods", None)
                   for m in r.methods})


def test_every_route_but_health_and_metrics_needs_a_key(rig_factory: Any) -> None:
    """Enumerates the app's own routes, so a route added later is covered too."""
    rig = rig_factory(auth=_keys())
    app = build_app(parse_policy({"backends": {"up": {"kind": "openai_compat",
                                                      "base_url": "http://127.0.0.1:9/v1"}},
                                  "routes": [{"match": "*", "backend": "up"}],
                                  "auth": _keys()}), rewrite_fn=None)
    routes = _routes(app)
    assert ("/openapi.json", "GET") in routes
    for path, method in routes:
        r = httpx.request(method, rig.url + _concrete(path), timeout=30, json={})
        if path in OPEN:
            assert r.status_code == 200, (method, path)
        elif method == "POST" and path == "/v1/responses/{response_id}":
            assert r.status_code == 404, r.text  # not served at all (compact and the like)
        else:
            assert r.status_code == 401, (method, path, r.status_code)
    assert rig.upstream.seen == []
    doc = httpx.get(rig.url + "/openapi.json", headers={"authorization": f"Bearer {KEY}"},
                    timeout=30)
    assert doc.status_code == 200 and "/v1/chat/completions" in doc.json()["paths"]


def test_openapi_document_stays_open_without_keys(rig: Any) -> None:
    """No keys configured (a loopback proxy): the document is served as before."""
    r = httpx.get(rig.url + "/openapi.json", timeout=30)
    assert r.status_code == 200 and r.json()["info"]["title"] == "prefixgate"
    assert httpx.head(rig.url + "/openapi.json", timeout=30).status_code == 200


def test_head_is_answered_wherever_get_is(rig: Any) -> None:
    """For every GET route of the app (``/api/savings``, ``/v1/responses/{id}`` were 405):
    HEAD has the GET's status and headers' content type, and no body."""
    app = build_app(parse_policy({"backends": {"up": {"kind": "openai_compat",
                                                      "base_url": "http://127.0.0.1:9/v1"}},
                                  "routes": [{"match": "*", "backend": "up"}]}), rewrite_fn=None)
    gets = [p for p, m in _routes(app) if m == "GET"]
    heads = {p for p, m in _routes(app) if m == "HEAD"}
    assert {"/api/savings", "/v1/responses/{response_id}", "/openapi.json"} <= set(gets)
    assert set(gets) <= heads
    for path in gets:
        url = rig.url + _concrete(path)
        g, h = httpx.get(url, timeout=30), httpx.head(url, timeout=30)
        assert h.status_code == g.status_code != 405, (path, g.status_code, h.status_code)
        assert h.content == b""
        assert h.headers.get("content-type") == g.headers.get("content-type"), path


def test_models_list_counts_against_the_keys_rate_limit(rig_factory: Any) -> None:
    """Not only the listing: ``/v1/models/{id}`` counts too, and a model request after them
    finds the window spent."""
    rig = rig_factory(auth=_keys(rpm=3))
    auth = {"authorization": f"Bearer {KEY}"}
    assert httpx.get(rig.url + "/v1/models", headers=auth, timeout=30).status_code == 200
    assert httpx.head(rig.url + "/v1/models", headers=auth, timeout=30).status_code == 200
    assert httpx.get(rig.url + "/v1/models/gpt-4o", headers=auth, timeout=30).status_code == 200
    over = httpx.get(rig.url + "/v1/models", headers=auth, timeout=30)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert httpx.get(rig.url + "/v1/models/gpt-4o", headers=auth, timeout=30).status_code == 429
    r = httpx.post(rig.url + "/v1/chat/completions", headers=auth, timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 429


POLICY = {"backends": {"a": {"kind": "openai_compat", "deployments": [
                           {"base_url": "http://a0.test/v1"}, {"base_url": "http://a1.test/v1"}]},
                       "b": {"kind": "local", "base_url": "http://b.test/v1"}},
          "routes": [{"match": "a-*", "backend": "a"}, {"match": "b-*", "backend": "b"}]}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _counting_client(asks: list[str], data: dict[str, Any], delay_s: float = 0.0
                     ) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        asks.append(request.url.host)
        await asyncio.sleep(delay_s)
        if request.url.host == "a0.test":
            return httpx.Response(503, text="down")  # not JSON: the next deployment is asked
        return httpx.Response(200, json={"data": data.get(request.url.host, [])})
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_live_listings_are_reused_per_backend_for_the_ttl() -> None:
    policy = parse_policy(POLICY)
    asks: list[str] = []
    clock = Clock()
    listings = Listings(clock=clock)
    data = {"a1.test": [{"id": "a-one"}], "b.test": [{"id": "b-two"}]}

    async def go() -> list[set[str]]:
        async with _counting_client(asks, data) as client:
            out = []
            for _ in range(5):
                doc = await list_models(client, policy, listings)
                out.append({m["id"] for m in doc["data"]})
            clock.t += LISTING_TTL_S - 0.01
            await list_models(client, policy, listings)
            clock.t += 0.02  # past the TTL: asked again
            await list_models(client, policy, listings)
            return out

    seen = asyncio.run(go())
    assert all(s == {"a-one", "b-two"} for s in seen)
    assert asks == ["a0.test", "a1.test", "b.test"] * 2


def test_concurrent_callers_share_one_ask_and_a_failed_ask_is_remembered() -> None:
    """Not in the issue: 20 callers at once cost one ask per backend (not 20), and a backend
    that answers nothing is not asked again within the TTL (a down backend would otherwise
    cost every caller its 2 s timeout)."""
    policy = parse_policy(POLICY)
    asks: list[str] = []
    listings = Listings(clock=Clock())

    async def go() -> None:
        async with _counting_client(asks, {}, delay_s=0.05) as client:
            await asyncio.gather(*(list_models(client, policy, listings) for _ in range(20)))
            await list_models(client, policy, listings)

    asyncio.run(go())
    assert sorted(asks) == ["a0.test", "a1.test", "b.test"]


def test_a_listing_is_bounded() -> None:
    policy = parse_policy(POLICY)
    huge = {"a1.test": [{"id": f"a-{i}"} for i in range(MAX_LISTED + 500)]}

    async def go() -> dict[str, Any]:
        async with _counting_client([], huge) as client:
            return await list_models(client, policy, Listings())

    assert len(asyncio.run(go())["data"]) == MAX_LISTED


def test_a_zero_ttl_asks_every_time() -> None:
    policy = parse_policy(POLICY)
    asks: list[str] = []

    async def go() -> None:
        async with _counting_client(asks, {}) as client:
            listings = Listings(ttl_s=0.0)
            await list_models(client, policy, listings)
            await list_models(client, policy, listings)

    asyncio.run(go())
    assert len(asks) == 6
