"""The send step: the failover loop (deployments, breakers, retries, fallbacks) behind the fan-out
gate, abandoned when the client leaves before the upstream's headers (499). A backend with a
``pd`` setting (prefill/decode disaggregation) is driven through ``routing.pd.drive`` instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import anyio
import httpx
import orjson
from fastapi import Request

from prefixgate.config.backend_kinds import traits
from prefixgate.config.routing import Deployment
from prefixgate.proxy.http.headers import upstream_headers
from prefixgate.proxy.http.server import CONNECTION_LOST
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.pipeline.prepare import asked_diagnostics
from prefixgate.proxy.routing.kv_match import event_matches
from prefixgate.proxy.routing.pd.drive import PDDriver
from prefixgate.proxy.routing.probes import cache_matches
from prefixgate.proxy.routing.retries import Picked, Sender, Step
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import send_unless_gone


async def send(ex: Exchange, request: Request, state: ProxyState) -> httpx.Response:
    """Send through the failover loop (502 / 504 when no deployment answered); abandoned (499)
    if the client leaves before the headers."""
    asked = asked_diagnostics(ex)

    def headers_for(t: Target) -> dict[str, bytes]:
        h = upstream_headers(request.headers.items(), t.backend, t.api_key())
        if asked and traits(t.backend.kind).wire == "anthropic":  # the diagnostics' beta
            h["anthropic-beta"] = with_beta(h.get("anthropic-beta"), DIAGNOSIS_BETA)
        return h

    ex.obs.sent_at = time.perf_counter()
    assert ex.rw is not None
    assert state.fanout is not None
    # routing.fanout: held only behind a writer of the same tenant (no cross-tenant timing)
    async with state.fanout.turn(ex.rw.body, ex.targets[0].provider, tenant=ex.row.tenant):
        step = ex.steps[0] if ex.steps else None
        if step is not None and step.target.backend.pd is not None and step.bridge.path in PD_PATHS:
            rid = request.headers.get("x-request-id")
            run = pd_send(state, ex, step, headers_for(step.target), rid)
        else:
            run = sender(state).run(ex.steps, headers_for, ex.session_id, ex.attempts, ex.picked)
        return await send_unless_gone(run, lambda: client_gone(request))


PD_PATHS = ("/chat/completions", "/completions")
DIAGNOSIS_BETA = "cache-diagnosis-2026-04-07"
"""Anthropic's cache-diagnostics beta (https://platform.claude.com/docs/en/build-with-claude/cache-diagnostics)."""


def with_beta(value: bytes | None, beta: str) -> bytes:
    """An ``anthropic-beta`` value with ``beta`` added to the client's comma list (kept as sent,
    ``beta`` appended once)."""
    have = value.decode("latin-1") if value else ""
    if beta in (b.strip() for b in have.split(",")):
        return value or beta.encode()
    return (f"{have},{beta}" if have.strip() else beta).encode("latin-1")


async def pd_send(state: ProxyState, ex: Exchange, step: Step, headers: dict[str, bytes],
                  request_id: str | None) -> httpx.Response:
    """One request through its backend's P/D pair (``routing.pd.drive``: split or colocate,
    decided per request and logged); the decode side's answer, unread. The ledger row's
    ``deployment`` says the decision: ``<backend>/pd-split:<reason>`` or
    ``<backend>/pd-colocate:<reason>``."""
    pd = step.target.backend.pd
    assert pd is not None
    driver = PDDriver(state.upstream.send)
    resp, dec = await driver.drive(pd, step.bridge.path, orjson.loads(step.body), headers,
                                   request_id)
    ex.picked(Picked(step, step.target, lambda: None))
    ex.row.deployment = (f"{step.target.deployment_name}/pd-"
                         f"{'split' if dec.split else 'colocate'}:{dec.reason}")
    return resp


def sender(state: ProxyState) -> Sender:
    """The failover loop over the app's upstream client, breakers and balancer (``exact``
    affinity reads the deployments' KV event indexes where they publish events, else asks
    their ``/v1/cache/match``)."""
    async def match(t: Target, deps: list[Deployment], body: bytes) -> list[int]:
        if state.side is None:
            return [0] * len(deps)
        if state.kv_events is not None:
            found = await event_matches(state.side, state.kv_events, t, deps, body)
            if found is not None:
                return found
        return await cache_matches(state.side, t, deps, body)

    assert state.breakers is not None
    return Sender(state.upstream.send, state.policy.retry, state.breakers, state.balancer, match,
                  shared=state.routing, budget=state.retry_budget)


def client_gone(request: Request) -> Awaitable[None]:
    """Done when the client disconnects: the connection's "lost" future where the server is
    prefixgate's (:data:`prefixgate.proxy.http.server.CONNECTION_LOST`; shielded, so the
    caller's cancel leaves it to the connection's next requests), else the next ASGI message
    being ``http.disconnect`` (its body has been read)."""
    lost = request.scope.get(CONNECTION_LOST)
    if isinstance(lost, asyncio.Future):
        return asyncio.shield(lost)
    return _disconnect_message(request)


async def _disconnect_message(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        await anyio.sleep(0.05)  # a server that sends empty bodies: do not spin
