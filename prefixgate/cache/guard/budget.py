"""What the guard's trials may spend per route per UTC day, and what they have spent.

A trial reserves its worst case before it sends (requests, tokens up to its ``max_tokens``, USD
at the route's price) and settles the actual after. :meth:`BudgetBook.reserve` never lets a
reservation pass a limit, however many replicas reserve at once: each of the three counters is
incremented first and checked after (INCRBY is atomic), and a reservation that finds any counter
past its limit takes back every increment it made (incr, check, roll back). A reservation may
therefore be refused while a concurrent one is being rolled back — never admitted past a limit.

Limits (:class:`TrialBudget`, the per-day figures of the policy's ``meaning_guard`` budgets):
``requests_per_day == 0`` means no trials; ``tokens_per_day`` is a limit like any other (0: no
trials); ``usd_per_day`` applies only when the route is ``priced`` — then 0 means no trials — and
is not checked for an unpriced route (a local or self-hosted engine).

Keys (SharedState prefixes them): ``guard:b:<route>:<day>:<field>``, fields ``requests``,
``tokens``, ``usd_micros`` (USD in millionths, so counters stay integers), each expiring two days
after its last change. Day: the UTC date of ``clock()``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol
from urllib.parse import quote

from prefixgate.cache.state.shared_state import SharedState

KEY_TTL_S = 2 * 86400.0
FIELDS = ("requests", "tokens", "usd_micros")


class BudgetLimits(Protocol):
    """Any object with the three per-day limits (:class:`TrialBudget` or the policy's model)."""

    requests_per_day: int
    tokens_per_day: int
    usd_per_day: float


@dataclass(frozen=True)
class TrialBudget:
    """A route's trial budget per UTC day (module docstring for what 0 means)."""

    requests_per_day: int = 0
    tokens_per_day: int = 0
    usd_per_day: float = 0.0


@dataclass(frozen=True)
class Reservation:
    """What one trial holds of ``route``'s budget on ``day`` (``YYYY-MM-DD``, UTC)."""

    route: str
    day: str
    requests: int
    tokens: int
    usd_micros: int


def usd_micros(usd: float) -> int:
    """USD as whole millionths, rounded up (a reservation never holds less than it costs).
    Read from the float's shortest decimal text, not ``usd * 10**6``: a product is off by float
    noise (above ~$8,590 the noise reaches a whole micro, and an amount exact to the micro would
    read one more)."""
    return math.ceil(Decimal(repr(float(usd))) * 1_000_000)


class BudgetBook:
    """Per-route, per-UTC-day trial spending over ``shared`` (module docstring). ``clock``: wall
    seconds (tests pass a fake to cross midnight)."""

    def __init__(self, shared: SharedState, clock: Callable[[], float] = time.time) -> None:
        self.shared, self._clock = shared, clock

    def _day(self) -> str:
        return datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%d")

    @staticmethod
    def _key(route: str, day: str, field: str) -> str:
        return f"guard:b:{quote(route, safe='')}:{day}:{field}"

    async def reserve(self, route: str, budget: BudgetLimits, requests: int, tokens: int,
                      usd: float, priced: bool) -> Reservation | None:
        """Hold ``requests`` / ``tokens`` / ``usd`` of today's budget for ``route``; None when
        any would pass its limit (nothing is then held). ``usd`` is counted and checked only when
        ``priced``. Raises ValueError on a negative amount."""
        if min(requests, tokens, usd) < 0:
            raise ValueError("a reservation's amounts must be >= 0")
        if budget.requests_per_day <= 0 or (priced and budget.usd_per_day <= 0):
            return None
        if not self._shared_up():
            return None  # fail closed: a replica counting alone could spend the fleet's budget
        day = self._day()
        micros = usd_micros(usd) if priced else 0
        wanted = [(FIELDS[0], requests, budget.requests_per_day),
                  (FIELDS[1], tokens, budget.tokens_per_day)]
        if priced:
            wanted.append((FIELDS[2], micros, usd_micros(budget.usd_per_day)))
        held: list[tuple[str, int]] = []
        for field, amount, limit in wanted:
            key = self._key(route, day, field)
            now = await self.shared.incr(key, amount, KEY_TTL_S)
            held.append((key, amount))
            if now > limit or not self._shared_up():
                for k, a in held:
                    await self.shared.incr(k, -a, KEY_TTL_S)
                return None
        return Reservation(route, day, requests, tokens, micros)

    def _shared_up(self) -> bool:
        """False while shared state is Redis and Redis is down: a RedisState then answers from
        its replica's own counters (:mod:`prefixgate.cache.state.shared_state`), and N replicas
        would each spend the whole daily budget. Local state is always up."""
        link = getattr(self.shared, "link", None)
        return link is None or bool(getattr(link, "up", True))

    async def settle(self, r: Reservation, tokens: int, usd: float,
                     requests: int | None = None) -> None:
        """Replace reservation ``r``'s tokens / USD by the actual ``tokens`` / ``usd``, and its
        requests by ``requests`` when given (the sends made; None: all it held): what was
        held and not used is given back; an actual above the reservation is charged too (the
        record stays true; it can only make later reservations fail). USD is settled only for a
        reservation that held some (a priced route)."""
        back_requests = 0 if requests is None else r.requests - max(0, requests)
        if back_requests:
            await self.shared.incr(self._key(r.route, r.day, FIELDS[0]), -back_requests,
                                   KEY_TTL_S)
        back_tokens = r.tokens - max(0, tokens)
        if back_tokens:
            await self.shared.incr(self._key(r.route, r.day, FIELDS[1]), -back_tokens, KEY_TTL_S)
        back_usd = r.usd_micros - usd_micros(max(0.0, usd)) if r.usd_micros else 0
        if back_usd:
            await self.shared.incr(self._key(r.route, r.day, FIELDS[2]), -back_usd, KEY_TTL_S)

    async def spent(self, route: str) -> dict[str, float]:
        """Today's ``requests``, ``tokens`` and ``usd`` for ``route`` (one round trip)."""
        day = self._day()
        vals, _ = await self.shared.read_many([self._key(route, day, f) for f in FIELDS], [])
        req, tok, micros = (int(v or 0) for v in vals)
        return {"requests": float(req), "tokens": float(tok), "usd": micros / 1_000_000}
