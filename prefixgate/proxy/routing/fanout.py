"""First-writer gating: a fan-out's requests read the prefix the first one writes.

When an agent starts N requests at once that share a prefix nobody has cached (parallel
sub-agents, map steps), each one misses and pays a cache write: Anthropic's prompt-caching
guide says a cache entry "only becomes available after the first response begins", so for
parallel requests one should "wait for the first response before sending subsequent requests".
The gate does that for the client:

* the first request of a prefix that is not *warm* is the **writer**: it goes upstream at once;
* a request with the same prefix arriving while the writer waits for its response headers is
  **held** until those headers arrive (its write is then readable), the writer fails, or the
  hold deadline passes — ``min(max_hold_ms, ttft_factor x the TTFT the gate has observed)`` —
  and then goes upstream;
* once a writer got its headers the prefix is warm for ``warm_s`` seconds: later requests go
  straight through.

The prefix is :func:`fanout_key`: the model, tools, system and every message but the last of
the upstream body (what parallel requests of one fan-out share; each differs in its last
message), inside the request's tenant: two tenants' identical prefixes never share a key, so
one tenant is never held behind another's writer — a hold would tell it that someone else is
sending its prefix (a timing channel: 2.1 s alone, 3.6 s while acme sent the same prefix,
issue 20 Medium 8). Bodies whose shared part is under ``min_prefix_bytes`` are never held.

:class:`GateCore` is the clock-driven state machine (no I/O), used by :class:`FanoutGate`
(asyncio, per proxy) and by the simulator (:mod:`prefixgate.proxy.sim.fanout`). Bounded: at most
:data:`MAX_KEYS` warm prefixes are remembered (oldest forgotten first).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from prefixgate.config.schema import FanoutSettings
from prefixgate.proxy.core import exactjson

MAX_KEYS = 10_000
EWMA_WEIGHT = 0.2


def fanout_key(body: dict[str, Any], tenant: str = "") -> tuple[str, int]:
    """``(hex key, bytes of the shared part)`` of an upstream body (either API) of ``tenant``
    ("" = no tenant): model, tools, system and all messages but the last, as compact JSON,
    hashed behind the tenant's name (length-prefixed, so no tenant name and body can collide
    with another's)."""
    msgs = body.get("messages")
    shared = {"model": body.get("model"), "tools": body.get("tools"),
              "system": body.get("system"),
              "messages": msgs[:-1] if isinstance(msgs, list) else None}
    raw = exactjson.dumps(shared)  # numbers as the client wrote them (beyond 64 bits too)
    name = tenant.encode("utf-8", "surrogatepass")
    scope = b"%d:" % len(name) + name + b"|"
    return hashlib.sha256(scope + raw).hexdigest()[:32], len(raw)


@dataclass
class GateCore:
    """The gate's decisions on an explicit clock (seconds). See the module docstring."""

    settings: FanoutSettings
    writers: dict[str, float] = field(default_factory=dict)
    warm: OrderedDict[str, float] = field(default_factory=OrderedDict)
    ttft_ewma_s: float | None = None

    def hold_budget_s(self) -> float:
        """Longest hold: ``max_hold_ms``, or ``ttft_factor`` x the observed TTFT if shorter."""
        cap = self.settings.max_hold_ms / 1000
        if self.ttft_ewma_s is None:
            return cap
        return min(cap, self.settings.ttft_factor * self.ttft_ewma_s)

    def arrive(self, key: str, now: float) -> float | None:
        """A request of prefix ``key`` at ``now``: ``None`` = go now (warm, or it is the
        writer), else the deadline (seconds, same clock) until which it waits for the writer."""
        until = self.warm.get(key)
        if until is not None and until > now:
            return None
        if key in self.writers:
            return now + self.hold_budget_s()
        self.writers[key] = now
        return None

    def is_writer(self, key: str, started: float) -> bool:
        """True when the request that arrived at ``started`` is ``key``'s writer."""
        return self.writers.get(key) == started

    def answered(self, key: str, now: float, ok: bool) -> None:
        """The writer of ``key`` got its response headers at ``now`` (``ok``) or failed."""
        started = self.writers.pop(key, None)
        if not ok or started is None:
            return
        ttft = now - started
        self.ttft_ewma_s = ttft if self.ttft_ewma_s is None else (
            (1 - EWMA_WEIGHT) * self.ttft_ewma_s + EWMA_WEIGHT * ttft)
        self.warm[key] = now + self.settings.warm_s
        self.warm.move_to_end(key)
        while len(self.warm) > MAX_KEYS:
            self.warm.popitem(last=False)


class FanoutGate:
    """The asyncio gate of one proxy. ``async with gate.turn(body):`` around the upstream send
    (exit = response headers received, or the send failed)."""

    def __init__(self, settings: FanoutSettings) -> None:
        self.settings = settings
        self.core = GateCore(settings)
        self._events: dict[str, asyncio.Event] = {}
        self.held = 0
        """Requests held so far (a counter for tests and metrics)."""

    @asynccontextmanager
    async def turn(self, body: dict[str, Any], provider: str = "anthropic", *,
                   tenant: str) -> AsyncIterator[None]:
        """Hold (bounded) while another request of ``tenant`` writes this body's prefix; see
        module docs. Only for backends of ``settings.providers`` (``provider``: the route's
        cache rules). ``tenant`` is required: a caller cannot forget it."""
        if not self.settings.enabled or provider not in self.settings.providers:
            yield
            return
        key, size = fanout_key(body, tenant)
        if size < self.settings.min_prefix_bytes:
            yield
            return
        now = time.monotonic()
        deadline = self.core.arrive(key, now)
        if deadline is not None:
            self.held += 1
            event = self._events.setdefault(key, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), max(0.0, deadline - now))
            except TimeoutError:
                pass
            yield
            return
        writer = self.core.is_writer(key, now)
        if writer:
            self._events[key] = asyncio.Event()
        ok = False
        try:
            yield
            ok = True
        finally:
            if writer:
                self.core.answered(key, time.monotonic(), ok)
                done = self._events.pop(key, None)
                if done is not None:
                    done.set()
