"""One async Redis connection for the proxy's shared state, and what happens when Redis is down.

Several proxy replicas (or ``--workers``) share state through Redis: session memory
(:mod:`prefixgate.cache.state.session_redis`), and small counters / values
(:mod:`prefixgate.cache.state.shared_state`)
for
breakers and affinity load. Every call goes through :meth:`RedisLink.run`, which is
``redis.asyncio`` (never a blocking call on the event loop) with a short per-operation timeout.

Redis down (connection refused, reset, timeout, any ``redis.RedisError``):

- the caller gets its ``fallback`` (the local state it keeps: requests are served on local state);
- ONE warning line per outage (``redis unavailable ... serving on local state``) and one
  ``redis recovered after N s`` line when it is back — never a line per request;
- metrics (in the app's registry): ``prefixgate_redis_up`` gauge (1 / 0),
  ``prefixgate_redis_outages_total`` and ``prefixgate_redis_fallbacks_total`` (operations answered
  from local state) counters;
- recovery is automatic: while down, calls return the fallback at once without touching the
  network, except one call every ``retry_every_s`` seconds that tries Redis again (its success
  ends the outage). No background task: an idle proxy does no work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("prefixgate.redis")

T = TypeVar("T")

OP_TIMEOUT_S = 0.5
"""One Redis operation (a round trip or a WATCH/MULTI transaction): past it, Redis counts as
down. Loopback / same-rack round trips take ~0.1 ms; 0.5 s tolerates a busy Redis."""
RETRY_EVERY_S = 1.0
"""While down, how often one call tries Redis again."""


class RedisLink:
    """A ``redis.asyncio.Redis`` on ``url`` plus its up / down state (module docstring).

    ``prefix``: prepended to every key by :meth:`key`; ``registry``: where the three metrics go
    (None: not exported). ``clock``: monotonic seconds (tests). The client connects lazily on the
    first call, in the event loop making it; one link serves one event loop.
    """

    def __init__(self, url: str, prefix: str = "prefixgate:", *,
                 registry: CollectorRegistry | None = None, op_timeout_s: float = OP_TIMEOUT_S,
                 retry_every_s: float = RETRY_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url, self.prefix = url, prefix
        self.op_timeout_s, self.retry_every_s = op_timeout_s, retry_every_s
        self._clock = clock
        self.client: Any = aioredis.Redis.from_url(
            url, socket_timeout=op_timeout_s, socket_connect_timeout=op_timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self.up = True
        self.outages = 0
        self.fallbacks = 0
        self._down_since = 0.0
        self._next_try = 0.0
        self._metrics(registry)

    def _metrics(self, registry: CollectorRegistry | None) -> None:
        self._m_up: Gauge | None = None
        if registry is None:
            return
        self._m_up = Gauge("prefixgate_redis_up", "1 while Redis answers, 0 during an outage",
                           registry=registry)
        self._m_up.set(1)
        self._m_outages = Counter("prefixgate_redis_outages", "Redis outages begun",
                                  registry=registry)
        self._m_fallbacks = Counter("prefixgate_redis_fallbacks",
                                    "Shared-state operations served from local state",
                                    registry=registry)

    def key(self, *parts: str) -> str:
        """``prefix`` + the parts joined by ``:``."""
        return self.prefix + ":".join(parts)

    async def run(self, op: Callable[[Any], Awaitable[T]], fallback: T) -> T:
        """``await op(client)`` within ``op_timeout_s``; ``fallback`` when Redis is down (or goes
        down now). Never raises for a Redis failure; raises what ``op`` raises otherwise."""
        import redis

        now = self._clock()
        if not self.up and now < self._next_try:
            self._fell_back()
            return fallback
        try:
            result = await asyncio.wait_for(op(self.client), self.op_timeout_s)
        except (TimeoutError, redis.RedisError, OSError) as e:
            self._went_down(e, now)
            self._fell_back()
            return fallback
        if not self.up:
            self._came_back(now)
        return result

    def _fell_back(self) -> None:
        self.fallbacks += 1
        if self._m_up is not None:
            self._m_fallbacks.inc()

    def _went_down(self, e: BaseException, now: float) -> None:
        self._next_try = now + self.retry_every_s
        if not self.up:
            return
        self.up, self._down_since = False, now
        self.outages += 1
        if self._m_up is not None:
            self._m_up.set(0)
            self._m_outages.inc()
        log.warning("redis unavailable (%s): serving on local state, retrying every %.1f s",
                    type(e).__name__, self.retry_every_s)

    def _came_back(self, now: float) -> None:
        self.up = True
        if self._m_up is not None:
            self._m_up.set(1)
        log.warning("redis recovered after %.1f s", now - self._down_since)

    async def close(self) -> None:
        """Close the client's connections (the app's lifespan end)."""
        try:
            await self.client.aclose()
        except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
            log.debug("closing the redis client failed", exc_info=True)
