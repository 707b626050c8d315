"""Per-key rate limits: requests and tokens per minute (issue 8, Authentication).

Fixed one-minute windows aligned to the clock (window ``floor(now / 60)``), the scheme OpenAI's
and Anthropic's own limits are documented in terms of. A request is admitted when, in the
current window, the key has made fewer than ``rpm`` requests and used fewer than ``tpm`` tokens;
the admitted request counts at once, its tokens (prompt + output, from the ledger row) are added
when it ends. So a request that starts under the token limit may finish over it: ``tpm`` bounds
when a key is refused, not the exact sum. A window boundary can admit up to 2 x ``rpm`` within
60 s; the price of a counter per key instead of a log of timestamps.

Refused: :class:`Refusal` with ``retry_after_s`` = whole seconds to the next window (>= 1).

Two stores with one interface (:class:`Limiter`):

- :class:`MemoryLimiter`: this process only (one ``prefixgate serve``).
- :class:`RedisLimiter`: shared by every proxy process on ``ledger.redis_url``; keys
  ``prefixgate:rl:<key id>:<window>:{req,tok}``, expiring after two windows. If Redis fails the
  request is admitted and a warning logged (fail-open: rate limiting is a budget, not the
  authentication, which never depends on Redis).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger("prefixgate.ratelimit")

WINDOW_S = 60
Clock = Callable[[], float]


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: ``kind`` ``requests`` / ``tokens`` (OpenAI's error types for
    429), ``limit`` per minute, ``retry_after_s`` whole seconds (>= 1)."""

    kind: Literal["requests", "tokens"]
    limit: int
    retry_after_s: int


def _window(now: float) -> tuple[int, int]:
    """(window index, whole seconds until it ends, >= 1)."""
    w = int(now // WINDOW_S)
    return w, max(1, math.ceil((w + 1) * WINDOW_S - now))


class Limiter(Protocol):
    """Counts requests and tokens per key and window."""

    def admit(self, key_id: str, rpm: int | None, tpm: int | None) -> Refusal | None:
        """Count one request for ``key_id`` unless it is over ``rpm`` / ``tpm`` (None =
        unlimited) in the current window; the Refusal when it is (then nothing is counted)."""
        ...

    def add_tokens(self, key_id: str, tokens: int) -> None:
        """Add ``tokens`` to ``key_id``'s current window."""
        ...


class MemoryLimiter:
    """In-process counters; thread-safe. ``clock``: unix seconds (tests inject one)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], list[int]] = {}  # (key, window) -> [req, tok]
        self._window = -1

    def _current(self, key_id: str) -> tuple[list[int], int]:
        w, left = _window(self._clock())
        if w != self._window:  # a new window: forget older ones (memory stays per live key)
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= w}
            self._window = w
        return self._counts.setdefault((key_id, w), [0, 0]), left

    def admit(self, key_id: str, rpm: int | None, tpm: int | None) -> Refusal | None:
        """See :class:`Limiter`."""
        with self._lock:
            c, left = self._current(key_id)
            if rpm is not None and c[0] >= rpm:
                return Refusal("requests", rpm, left)
            if tpm is not None and c[1] >= tpm:
                return Refusal("tokens", tpm, left)
            c[0] += 1
            return None

    def add_tokens(self, key_id: str, tokens: int) -> None:
        """See :class:`Limiter`."""
        if tokens <= 0:
            return
        with self._lock:
            self._current(key_id)[0][1] += tokens


class RedisLimiter:
    """Counters in Redis at ``url`` (shared by proxy processes); ``client``: an already made
    ``redis.Redis`` (tests). Fail-open on Redis errors (see module docstring)."""

    PREFIX = "prefixgate:rl:"

    def __init__(self, url: str | None = None, *, client: Any = None,
                 clock: Clock = time.time) -> None:
        if client is None:
            import redis

            client = redis.Redis.from_url(url or "")
        self._r = client
        self._clock = clock

    def _keys(self, key_id: str, w: int) -> tuple[str, str]:
        base = f"{self.PREFIX}{key_id}:{w}:"
        return base + "req", base + "tok"

    def admit(self, key_id: str, rpm: int | None, tpm: int | None) -> Refusal | None:
        """See :class:`Limiter`. One round trip: INCR requests, GET tokens, EXPIRE."""
        w, left = _window(self._clock())
        req_key, tok_key = self._keys(key_id, w)
        try:
            pipe = self._r.pipeline()
            pipe.incr(req_key)
            pipe.get(tok_key)
            pipe.expire(req_key, 2 * WINDOW_S)
            n, tok, _ = pipe.execute()
            if rpm is not None and int(n) > rpm:
                self._r.decr(req_key)  # a refused request does not use the budget
                return Refusal("requests", rpm, left)
            if tpm is not None and int(tok or 0) >= tpm:
                self._r.decr(req_key)
                return Refusal("tokens", tpm, left)
        except Exception as e:  # noqa: BLE001 - fail-open, see module docstring
            log.warning("rate limiter: Redis unavailable (%s); request admitted", type(e).__name__)
        return None

    def add_tokens(self, key_id: str, tokens: int) -> None:
        """See :class:`Limiter`."""
        if tokens <= 0:
            return
        w, _ = _window(self._clock())
        _, tok_key = self._keys(key_id, w)
        try:
            pipe = self._r.pipeline()
            pipe.incrby(tok_key, tokens)
            pipe.expire(tok_key, 2 * WINDOW_S)
            pipe.execute()
        except Exception as e:  # noqa: BLE001 - fail-open
            log.warning("rate limiter: Redis unavailable (%s); tokens not counted",
                        type(e).__name__)
