"""Side requests the proxy makes to its deployments, off the request's own send (issue 10):

- :func:`cache_matches`: ``POST <base_url>/cache/match`` with the request's upstream bytes on
  each deployment of a group at once; our engine answers ``{"cached_tokens": n}`` from its
  radix tree without touching it (:mod:`prefixgate.local_engine.server.app`). Any failure or a slow answer
  (past ``affinity.match_timeout_ms``) counts as 0: exact affinity then falls back to hashing.
- :func:`health_check_loop`: optional active checks (``health_checks.interval_s``): ``GET
  <base_url>/models`` on every deployment; a failure counts against its breaker, a success
  closes a half-open one.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from prefixgate.config.routing import Deployment
from prefixgate.config.schema import Policy
from prefixgate.proxy.routing.breaker import BreakerBoard
from prefixgate.proxy.routing.router import Target

log = logging.getLogger("prefixgate.probes")


async def cache_matches(client: httpx.AsyncClient, target: Target, deps: list[Deployment],
                        body: bytes) -> list[int]:
    """Cached tokens of ``body`` on each deployment (0 when unknown), in ``deps`` order."""
    timeout = target.backend.affinity.match_timeout_ms / 1e3

    async def one(d: Deployment) -> int:
        try:
            r = await client.post(d.base_url + "/cache/match", content=body, timeout=timeout,
                                  headers={"content-type": "application/json"})
            n = r.json().get("cached_tokens") if r.status_code == 200 else 0
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0
        return n if isinstance(n, int) and not isinstance(n, bool) else 0

    return list(await asyncio.gather(*(one(d) for d in deps)))


async def check_once(client: httpx.AsyncClient, policy: Policy, breakers: BreakerBoard) -> None:
    """One round of active health checks over every deployment of every backend."""
    async def one(d: Deployment, timeout: float) -> None:
        b = breakers.get(d.name)
        try:
            r = await client.get(d.base_url + "/models", timeout=timeout)
            ok = r.status_code < 500
        except httpx.HTTPError:
            ok = False
        if ok:
            if b.state != "closed":
                b.success()
        else:
            b.failure("health_check")

    t = policy.health_checks.timeout_s
    await asyncio.gather(*(one(d, t) for name, be in policy.backends.items()
                           for d in be.group(name)))


async def health_check_loop(client: httpx.AsyncClient, policy: Policy,
                            breakers: BreakerBoard) -> None:
    """Run :func:`check_once` every ``health_checks.interval_s`` seconds, forever."""
    while True:
        try:
            await check_once(client, policy, breakers)
        except Exception:
            log.exception("health check round failed")
        await asyncio.sleep(policy.health_checks.interval_s)
