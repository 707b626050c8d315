"""The send step: the failover loop (deployments, breakers, retries, fallbacks) behind the fan-out
gate, abandoned when the client leaves before the upstream's headers (499).
"""

from __future__ import annotations

import time

import anyio
import httpx
from fastapi import Request

from prefixgate.config.routing import Deployment
from prefixgate.proxy.http.headers import upstream_headers
from prefixgate.proxy.pipeline.exchange import Exchange, ProxyState
from prefixgate.proxy.routing.kv_match import event_matches
from prefixgate.proxy.routing.probes import cache_matches
from prefixgate.proxy.routing.retries import Sender
from prefixgate.proxy.routing.router import Target
from prefixgate.proxy.upstream.client import send_unless_gone


async def send(ex: Exchange, request: Request, state: ProxyState) -> httpx.Response:
    """Send through the failover loop (502 / 504 when no deployment answered); abandoned (499)
    if the client leaves before the headers."""
    def headers_for(t: Target) -> dict[str, bytes]:
        return upstream_headers(request.headers.items(), t.backend, t.api_key())

    ex.obs.sent_at = time.perf_counter()
    assert ex.rw is not None
    assert state.fanout is not None
    # routing.fanout: held only behind a writer of the same tenant (no cross-tenant timing)
    async with state.fanout.turn(ex.rw.body, ex.targets[0].provider, tenant=ex.row.tenant):
        run = sender(state).run(ex.steps, headers_for, ex.session_id, ex.attempts, ex.picked)
        return await send_unless_gone(run, lambda: client_gone(request))


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


async def client_gone(request: Request) -> None:
    """Return when the client disconnects (its body has been read: the next ASGI message is
    ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        await anyio.sleep(0.05)  # a server that sends empty bodies: do not spin
