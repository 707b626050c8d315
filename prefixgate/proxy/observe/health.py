"""Is the proxy healthy? Event-loop lag measured in the background, and the verdict of
``GET /healthz`` (issue 8, "Resource accounting").

:class:`LoopLagMonitor` sleeps ``interval_s`` again and again and records how much later than
asked it woke up: the time the loop was busy with something else (a CPU-bound step on the loop
delays every other request by as much). Started and stopped by the app's lifespan.

:func:`health_reasons` turns the numbers into reasons to say "degraded" (HTTP 503), so a load
balancer stops sending traffic before the proxy becomes an outage:

- upstream responses in use at or above :data:`IN_USE_DEGRADED` of the pool's size (a leak, or
  load the pool cannot take: the next requests wait for a connection, then time out);
- requests queued for a pool connection;
- event-loop lag at or above :data:`LAG_DEGRADED_S` in the recent window (every request's
  latency grows by as much).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

log = logging.getLogger("prefixgate.health")

IN_USE_DEGRADED = 0.9   # fraction of the pool's max_connections
LAG_DEGRADED_S = 0.5    # seconds; a tenth of a typical agent call's time to first token


class LoopLagMonitor:
    """Measures event-loop lag: ``interval_s`` between samples (seconds), the last ``window``
    samples kept. ``last_s`` / ``recent_max_s``: the newest and the largest kept lag (s)."""

    def __init__(self, interval_s: float = 0.1, window: int = 20) -> None:
        self.interval_s = interval_s
        self.samples: collections.deque[float] = collections.deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None

    @property
    def last_s(self) -> float:
        """The newest lag sample, seconds (0 before the first)."""
        return self.samples[-1] if self.samples else 0.0

    @property
    def recent_max_s(self) -> float:
        """The largest lag in the window, seconds (0 before the first sample)."""
        return max(self.samples, default=0.0)

    async def run(self) -> None:
        """Sample forever (until cancelled)."""
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, loop.time() - t0 - self.interval_s))

    def start(self) -> None:
        """Start sampling in a background task on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="loop-lag")

    async def stop(self) -> None:
        """Stop sampling and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def health_reasons(in_use: int, max_connections: int, queued: int, lag_s: float) -> list[str]:
    """Why the proxy is degraded (empty list: healthy). ``in_use``: upstream responses open;
    ``max_connections``: the pool's size; ``queued``: requests waiting for a pool connection;
    ``lag_s``: recent event-loop lag, seconds. Thresholds: see module docstring."""
    reasons = []
    if in_use >= IN_USE_DEGRADED * max_connections:
        reasons.append(f"upstream responses in use: {in_use} of a pool of {max_connections}")
    if queued > 0:
        reasons.append(f"requests waiting for an upstream connection: {queued}")
    if lag_s >= LAG_DEGRADED_S:
        reasons.append(f"event loop lag {lag_s * 1e3:.0f} ms (limit {LAG_DEGRADED_S * 1e3:.0f} ms)")
    return reasons
