"""Per-key rate limits: requests and tokens per minute (issue 8, Authentication; issue 20 High 4,
Medium 12, Low).

Fixed one-minute windows aligned to the clock (window ``floor(now / 60)``), the scheme OpenAI's
and Anthropic's own limits are documented in terms of. A request is admitted when, in the
current window, the key has made fewer than ``rpm`` requests and used fewer than ``tpm`` tokens.
The check and the charge are one atomic step (:meth:`Limiter.admit`): the admitted request
counts at once, with its prompt's estimated tokens, so concurrent requests cannot all pass
before any is charged. What the request then spends is added by :class:`prefixgate.proxy.http.auth.Guard`
(output as it streams, the usage when it arrives). A request that starts under the token limit
may finish over it: ``tpm`` bounds when a key is refused, not the exact sum. A window boundary
can admit up to 2 x ``rpm`` within 60 s; the price of a counter per key instead of a log of
timestamps.

Refused: :class:`Refusal` with ``retry_after_s`` = whole seconds to the next window (>= 1).

Two stores with one interface (:class:`Limiter`):

- :class:`MemoryLimiter`: this process only (one ``prefixgate serve``).
- :class:`RedisLimiter`: shared by every proxy process on ``ledger.redis_url``, through the app's
  one :class:`prefixgate.cache.state.redis_link.RedisLink` (``redis.asyncio``, a 0.5 s operation
  timeout, its outage state): keys ``<ledger.redis_prefix>rl:<key id>:<window>:{req,tok}``,
  expiring after two windows. While Redis is down (refused, reset, or hung past the timeout)
  each process limits on its own :class:`MemoryLimiter` — every key keeps a limit, per process —
  and the link says so (one warning per outage, ``prefixgate_redis_up`` 0, no network call
  except one retry a second). Authentication never depends on Redis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio

from prefixgate.cache.state.redis_link import RedisLink
from prefixgate.proxy.http.body import OFF_LOOP_BYTES
from prefixgate.rewriter.analysis.tokens import json_tokens

log = logging.getLogger("prefixgate.ratelimit")

WINDOW_S = 60
Clock = Callable[[], float]
_DOWN: Any = object()


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: ``kind`` ``requests`` / ``tokens`` (OpenAI's error types for
    429), ``limit`` per minute, ``retry_after_s`` whole seconds (>= 1)."""

    kind: Literal["requests", "tokens"]
    limit: int
    retry_after_s: int


def window_of(now: float) -> tuple[int, int]:
    """(window index, whole seconds until it ends, >= 1) at unix time ``now``."""
    w = int(now // WINDOW_S)
    return w, max(1, math.ceil((w + 1) * WINDOW_S - now))


class Limiter(Protocol):
    """Counts requests and tokens per key and window."""

    def window(self) -> int:
        """The current window's index."""
        ...

    async def admit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int = 0,
                    pending: int = 0) -> Refusal | None:
        """In one atomic step: add ``pending`` tokens (spent by requests in flight, counted
        whatever the answer), then refuse when the key is at ``rpm`` requests or ``tpm`` tokens
        (None = unlimited) in the current window — the Refusal — or else count one request and
        ``tokens`` (the new request's prompt estimate) and return None."""
        ...

    def add_tokens(self, key_id: str, tokens: int, window: int | None = None) -> None:
        """Add ``tokens`` (negative: give back) to ``key_id``'s window ``window`` (None: the
        current one). Never blocks and never raises: a shared store writes in the background."""
        ...


class MemoryLimiter:
    """In-process counters; thread-safe. ``clock``: unix seconds (tests inject one). Windows
    older than the previous one are forgotten (memory stays per live key)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], list[int]] = {}  # (key, window) -> [req, tok]
        self._window = -1

    def window(self) -> int:
        """See :class:`Limiter`."""
        return window_of(self._clock())[0]

    def _prune(self, w: int) -> None:
        if w != self._window:
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= w - 1}
            self._window = w

    def admit_now(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int = 0,
                  pending: int = 0) -> Refusal | None:
        """:meth:`admit`, synchronously."""
        with self._lock:
            w, left = window_of(self._clock())
            self._prune(w)
            c = self._counts.setdefault((key_id, w), [0, 0])
            c[1] += pending
            if rpm is not None and c[0] >= rpm:
                return Refusal("requests", rpm, left)
            if tpm is not None and c[1] >= tpm:
                return Refusal("tokens", tpm, left)
            c[0] += 1
            c[1] += tokens
            return None

    async def admit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int = 0,
                    pending: int = 0) -> Refusal | None:
        """See :class:`Limiter`."""
        return self.admit_now(key_id, rpm, tpm, tokens, pending)

    def add_tokens(self, key_id: str, tokens: int, window: int | None = None) -> None:
        """See :class:`Limiter`. A window already forgotten takes nothing."""
        if tokens == 0:
            return
        with self._lock:
            w = window_of(self._clock())[0]
            self._prune(w)
            target = w if window is None else window
            c = self._counts.get((key_id, target))
            if c is None and target == w:
                c = self._counts.setdefault((key_id, w), [0, 0])
            if c is not None:
                c[1] = max(0, c[1] + tokens)

    def used(self, key_id: str, window: int | None = None) -> tuple[int, int]:
        """(requests, tokens) of ``key_id`` in ``window`` (None: the current one)."""
        with self._lock:
            w = self.window() if window is None else window
            c = self._counts.get((key_id, w), [0, 0])
            return c[0], c[1]


# KEYS: requests, tokens. ARGV: rpm, tpm (-1: none), tokens, pending, ttl s.
# Returns {0 admitted | 1 over rpm | 2 over tpm, requests, tokens}.
_ADMIT_LUA = """
local ttl = tonumber(ARGV[5])
local pending = tonumber(ARGV[4])
if pending ~= 0 then
  redis.call('INCRBY', KEYS[2], pending)
  redis.call('EXPIRE', KEYS[2], ttl)
end
local req = tonumber(redis.call('GET', KEYS[1]) or '0')
local tok = tonumber(redis.call('GET', KEYS[2]) or '0')
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
if rpm >= 0 and req >= rpm then return {1, req, tok} end
if tpm >= 0 and tok >= tpm then return {2, req, tok} end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ttl)
local add = tonumber(ARGV[3])
if add ~= 0 then
  redis.call('INCRBY', KEYS[2], add)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return {0, req + 1, tok + add}
"""

# KEYS: tokens. ARGV: tokens (may be negative), ttl s. Never below 0.
_ADD_LUA = """
local v = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
if v < 0 then redis.call('SET', KEYS[1], 0) end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return v
"""


class RedisLimiter:
    """Counters in Redis behind ``link`` (shared by proxy processes; keys under the link's
    prefix, see module docstring); ``local`` limits while Redis is down. ``clock``: unix
    seconds (tests). One limiter serves the event loop of its link."""

    def __init__(self, link: RedisLink, local: MemoryLimiter | None = None,
                 clock: Clock = time.time) -> None:
        self.link = link
        self._clock = clock
        self.local = local if local is not None else MemoryLimiter(clock)
        self._tasks: set[asyncio.Task[None]] = set()

    def window(self) -> int:
        """See :class:`Limiter`."""
        return window_of(self._clock())[0]

    def keys(self, key_id: str, w: int) -> tuple[str, str]:
        """The Redis keys of ``key_id``'s window ``w``: (requests, tokens)."""
        return self.link.key("rl", key_id, str(w), "req"), self.link.key("rl", key_id, str(w), "tok")

    async def admit(self, key_id: str, rpm: int | None, tpm: int | None, tokens: int = 0,
                    pending: int = 0) -> Refusal | None:
        """See :class:`Limiter`: one round trip (a Lua script, atomic in Redis)."""
        w, left = window_of(self._clock())
        req_key, tok_key = self.keys(key_id, w)
        got = await self.link.run(lambda r: r.eval(
            _ADMIT_LUA, 2, req_key, tok_key, -1 if rpm is None else rpm,
            -1 if tpm is None else tpm, tokens, pending, 2 * WINDOW_S), _DOWN)
        if got is _DOWN:  # Redis is out: this process's own counters (module docstring)
            return self.local.admit_now(key_id, rpm, tpm, tokens, pending)
        verdict = int(got[0])
        if verdict == 1:
            assert rpm is not None
            return Refusal("requests", rpm, left)
        if verdict == 2:
            assert tpm is not None
            return Refusal("tokens", tpm, left)
        return None

    def add_tokens(self, key_id: str, tokens: int, window: int | None = None) -> None:
        """See :class:`Limiter`: written by a background task (:meth:`drain` awaits them)."""
        if tokens == 0:
            return
        w = self.window() if window is None else window
        self._spawn(self._add(key_id, tokens, w))

    async def _add(self, key_id: str, tokens: int, w: int) -> None:
        _, tok_key = self.keys(key_id, w)
        got = await self.link.run(lambda r: r.eval(_ADD_LUA, 1, tok_key, tokens, 2 * WINDOW_S),
                                  _DOWN)
        if got is _DOWN:
            self.local.add_tokens(key_id, tokens, w)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a sync caller outside the app): count locally
            coro.close()
            log.warning("rate limiter: no event loop; tokens not written to Redis")
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the token writes in flight (tests; the app's shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


@dataclass(eq=False)
class Ticket:
    """What one admitted request has been charged against its key's ``tpm`` (tokens):
    ``estimate`` (its prompt, at admission, in window ``window``) and ``output`` (output charged
    so far). ``progress``: () -> output tokens seen so far (set once the answer streams; None
    before). ``settled``: the end's difference has been charged (then nothing more is);
    ``tokens``: False for a request that spends no model tokens (only its request counted)."""

    key_id: str
    window: int
    estimate: int
    output: int = 0
    progress: Callable[[], int] | None = None
    settled: bool = False
    tokens: bool = True  # False: the request spends no model tokens (nothing to settle)

    @property
    def charged(self) -> int:
        """Tokens charged for this request so far."""
        return self.estimate + self.output

    def unseen(self) -> int:
        """Output seen but not yet charged (tokens, >= 0)."""
        if self.progress is None:
            return 0
        try:
            return max(0, int(self.progress()) - self.output)
        except Exception:  # noqa: BLE001 - a progress read must never fail an admission
            return 0

    def pending(self) -> int:
        """:meth:`unseen`, now counted as charged: the caller charges it (0 once settled)."""
        new = 0 if self.settled else self.unseen()
        self.output += new
        return new


def _quarter(text: str) -> int:
    return (len(text) + 3) // 4


def estimate_now(body: Any, size: int) -> int:
    """The prompt tokens of request ``body`` (parsed JSON, ``size`` bytes) as the proxy counts
    them: its JSON text / 4 (OpenAI's rule of thumb, ~4 characters of English per token; the
    keys and punctuation make it an over-estimate, never an under-estimate for text) with each
    image / audio / file at its fixed cost, never its base64
    (:func:`prefixgate.rewriter.analysis.tokens.json_tokens`). Falls back to ``size / 4``."""
    try:
        return json_tokens(body, _quarter)
    except Exception:  # noqa: BLE001 - a number json cannot write, a body too odd: the bytes
        return (size + 3) // 4


async def prompt_estimate(body: Any, size: int) -> int:
    """:func:`estimate_now`, in a worker thread for bodies over
    :data:`prefixgate.proxy.http.body.OFF_LOOP_BYTES` (the walk is linear in the body)."""
    if size > OFF_LOOP_BYTES:
        return int(await anyio.to_thread.run_sync(estimate_now, body, size))
    return estimate_now(body, size)
