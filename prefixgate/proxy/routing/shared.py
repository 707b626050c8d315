"""Breaker state and affinity load shared by proxy replicas through :mod:`prefixgate.cache.state.shared_state`
(issue 10, item 6).

Each replica keeps its own :class:`prefixgate.proxy.routing.breaker.BreakerBoard` and
:class:`prefixgate.proxy.routing.balance.Balancer`
(the hot path reads them without I/O); :class:`SharedRouting` links them to the other replicas'
through three kinds of shared names, per deployment ``<dep>``:

- ``breaker:<dep>`` — ``"open|<unix s>|<reason>"`` with the cooldown as TTL, written when a
  breaker opens here; ``"closed|<unix s>|"`` when a probe here closes it. A replica that reads an
  ``open`` it has not applied yet opens its own breaker for the rest of that cooldown
  (:meth:`Breaker.open_from_peer`); then its own half-open probe decides, as for a local opening,
  unless another replica's probe closes it first (a ``closed`` newer than the opening applied:
  :meth:`Breaker.close_from_peer`).
- ``fail:<dep>`` — failures in a row across replicas (INCRBY, TTL = the breaker's ``window_s``,
  so an old streak expires); a success here resets it when this replica last saw it non-zero.
  Reaching ``consecutive_failures`` opens the breaker everywhere even when no single replica
  saw that many.
- ``load:<dep>`` — a table ``{replica id: "<in flight> <expires unix s>"}``. Each replica
  writes its OWN exact in-flight count (a SET of the current value, never a shared +1/-1), so a
  lost or reordered write is corrected by the next one and nothing drifts. **Leaks**: a crashed
  replica's entry carries its expiry (:data:`LOAD_TTL_S`) and readers ignore it after that; a
  live replica rewrites its entries with work in flight when half that TTL has passed, on its
  next send. The table itself expires when no replica has written it for a day.

**Clocks** (issue 20): a time read from shared state was written by another replica's clock,
which may be ahead (skew, a bad NTP step) or simply wrong. So no such time is trusted beyond
the TTL its writer meant: a load entry counts until ``min(its expiry, first seen here +
load_ttl_s)`` (:func:`others_load`; an entry's text changes with every write, so a live
replica's entries are "first seen" again on each rewrite, and one whose expiry lies a year
ahead stops counting a TTL after it last changed), and a breaker opening stamped in the future
counts as opened now — for one cooldown — while its news is applied once, not again on every
read (:meth:`SharedRouting._apply_breaker`).

Cost: nothing of this exists with :class:`prefixgate.cache.state.shared_state.LocalState`
(``ProxyState`` makes no SharedRouting; the Sender does not call it). With Redis, per send: one
pipelined read (:meth:`refresh`: MGET of the group's ``breaker`` / ``fail`` values + HGETALL of its
``load`` tables; concurrent sends share one read, and a read younger than :data:`SNAPSHOT_MAX_AGE_S`
is reused); the load writes go out from one background task that coalesces bursts; breaker writes
happen only on failures and on the success that ends a streak. Redis down → RedisState answers from
its local state, i.e. each replica routes on its own counts (one log line per outage and the
``prefixgate_redis_*`` metrics come from :mod:`prefixgate.cache.state.redis_link`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from prefixgate.cache.state.shared_state import SharedState
from prefixgate.proxy.routing.balance import Balancer
from prefixgate.proxy.routing.breaker import CLOSED, OPEN, BreakerBoard

log = logging.getLogger("prefixgate.proxy")

SNAPSHOT_MAX_AGE_S = 0.02
"""A group's shared read is reused this long (s): a burst of sends makes one round trip."""
LOAD_TTL_S = 60.0
"""A replica's load entry counts this long after its last write (s): a crashed replica's
in-flight requests stop counting within it."""
TABLE_TTL_S = 86_400.0
"""A ``load:<dep>`` table nobody wrote for this long is dropped by Redis."""


def parse_breaker(value: str | None) -> tuple[str, float, str] | None:
    """``(state, opened unix s, reason)`` of a ``breaker:<dep>`` value; None when absent or
    unreadable."""
    if not value:
        return None
    state, _, rest = value.partition("|")
    stamp, _, reason = rest.partition("|")
    try:
        return state, float(stamp), reason
    except ValueError:
        return None


def others_load(table: dict[str, str], me: str, now: float, ttl_s: float = LOAD_TTL_S,
                seen: dict[tuple[str, str], float] | None = None) -> int:
    """Sum of the live entries of a ``load:<dep>`` table other than replica ``me``'s.

    An entry ``"<count> <expires unix s>"`` is live while ``now`` is before both its expiry
    and ``first seen + ttl_s`` (module docstring, "Clocks"): ``seen`` maps ``(replica, entry
    text)`` to when this reader first saw it (updated here, and pruned to the table's current
    entries); without ``seen`` an entry counts as first seen ``now``, so its expiry is clamped
    to ``now + ttl_s``."""
    total = 0
    current: set[tuple[str, str]] = set()
    for replica, entry in table.items():
        if replica == me:
            continue
        count, _, expires = entry.partition(" ")
        first = now
        if seen is not None:
            current.add((replica, entry))
            first = seen.setdefault((replica, entry), now)
        try:
            if min(float(expires), first + ttl_s) > now:
                total += max(0, int(count))
        except ValueError:
            continue
    if seen is not None:
        for gone in [k for k in seen if k not in current]:
            del seen[gone]
    return total


class SharedRouting:
    """Links one replica's breakers and balancer to the others' (module docstring).

    ``clock``: unix seconds (shared by replicas, unlike a monotonic clock); ``replica``: this
    replica's id in the load tables (default: a random one per process)."""

    def __init__(self, shared: SharedState, board: BreakerBoard, balancer: Balancer, *,
                 replica: str | None = None, max_age_s: float = SNAPSHOT_MAX_AGE_S,
                 load_ttl_s: float = LOAD_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.shared, self.board, self.balancer = shared, board, balancer
        self.replica = replica or uuid.uuid4().hex[:12]
        self.max_age_s, self.load_ttl_s, self.clock = max_age_s, load_ttl_s, clock
        self._read_at: dict[tuple[str, ...], float] = {}
        self._reading: dict[tuple[str, ...], asyncio.Future[None]] = {}
        self._applied: dict[str, float] = {}  # deployment -> opening stamp applied here
        self._applied_news: dict[str, tuple[str, float, str]] = {}  # the breaker value applied
        self._first_seen: dict[str, dict[tuple[str, str], float]] = {}  # load entries, "Clocks"
        self._fails: dict[str, int] = {}  # deployment -> shared streak last seen
        self._written: dict[str, float] = {}  # deployment -> when our load entry was written
        self._dirty: set[str] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # streak ends in flight (kept referenced)
        balancer.on_change = self.load_changed

    # ---- reads -----------------------------------------------------------------------------

    async def refresh(self, names: Sequence[str]) -> None:
        """Read the group ``names``' shared breakers, streaks and loads (one round trip, shared
        by concurrent callers, reused for ``max_age_s``) and apply them here."""
        key = tuple(names)
        pending = self._reading.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            return
        if self.clock() - self._read_at.get(key, float("-inf")) < self.max_age_s:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading[key] = fut
        try:
            await self._read(names)
        finally:
            self._read_at[key] = self.clock()
            del self._reading[key]
            fut.set_result(None)

    async def _read(self, names: Sequence[str]) -> None:
        values = [f"breaker:{n}" for n in names] + [f"fail:{n}" for n in names]
        vals, tables = await self.shared.read_many(values, [f"load:{n}" for n in names])
        now = self.clock()
        for i, n in enumerate(names):
            self._apply_breaker(n, parse_breaker(vals[i]), now)
            try:
                self._fails[n] = int(vals[len(names) + i] or 0)
            except ValueError:
                self._fails[n] = 0
            self.balancer.others[n] = others_load(tables[i], self.replica, now, self.load_ttl_s,
                                                  self._first_seen.setdefault(n, {}))
            if (self.balancer.inflight[n] > 0
                    and now - self._written.get(n, 0.0) > self.load_ttl_s / 2):
                self.load_changed(n)  # keep our live entry from expiring

    def _apply_breaker(self, name: str, seen: tuple[str, float, str] | None,
                       now: float) -> None:
        """Apply a peer's breaker news once; a stamp ahead of ``now`` counts as ``now``
        (module docstring, "Clocks"), so it neither opens the breaker for longer than one
        cooldown nor hides the later news of a replica whose clock is right. News stamped the
        same millisecond as the news applied is newer (the name holds one value: a reopening
        right after a closing must reach the peers, issue 21)."""
        if seen is None or self._applied_news.get(name) == seen:
            return
        stamp = min(seen[1], now)
        if self._applied.get(name, float("-inf")) > stamp:
            return  # older than the news applied; the same ms but other news is newer (one value)
        self._applied[name], self._applied_news[name] = stamp, seen
        age = now - stamp
        if seen[0] == CLOSED:
            self.board.get(name).close_from_peer()
        elif seen[0] == OPEN and age < self.board.settings.cooldown_s:
            self.board.get(name).open_from_peer(f"{seen[2]} (another replica)", age)

    # ---- writes ----------------------------------------------------------------------------

    async def failed(self, name: str, was: str) -> None:
        """Deployment ``name`` failed here (its breaker already noted it; ``was``: its state
        before): count the shared streak; publish an opening (ours, or the streak's)."""
        s = self.board.settings
        streak = await self.shared.incr(f"fail:{name}", 1, s.window_s)
        self._fails[name] = streak
        breaker = self.board.get(name)
        if breaker.state == OPEN and was != OPEN:
            await self._publish(name, OPEN, breaker.last_reason, s.cooldown_s)
        elif s.enabled and breaker.state == CLOSED and streak >= s.consecutive_failures:
            breaker.open_from_peer(f"{breaker.last_reason} ({streak} in a row, all replicas)", 0)
            await self._publish(name, OPEN, breaker.last_reason, s.cooldown_s)

    def succeeded(self, name: str, was: str) -> None:
        """Deployment ``name`` answered here (``was``: its breaker's state before): end the
        shared streak / publish the closing, only when there is one to end (no I/O otherwise)."""
        if was == CLOSED and not self._fails.get(name):
            return
        self._fails[name] = 0
        task = asyncio.get_running_loop().create_task(self._end_streak(name, was != CLOSED))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_streak(self, name: str, closed: bool) -> None:
        await self.shared.put(f"fail:{name}", "0", self.board.settings.window_s)
        if closed:
            await self._publish(name, CLOSED, "", self.board.settings.cooldown_s)

    async def _publish(self, name: str, state: str, reason: str, ttl_s: float) -> None:
        stamp = self.clock()
        self._applied[name] = stamp  # our own news: nothing to apply when read back
        await self.shared.put(f"breaker:{name}", f"{state}|{stamp:.3f}|{reason}", ttl_s)

    def load_changed(self, name: str) -> None:
        """The balancer's in-flight count of ``name`` changed: write it soon (coalesced)."""
        self._dirty.add(name)
        if self._flusher is None or self._flusher.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a sync caller, tests): the next change writes it
                return
            self._flusher = loop.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._dirty:
                name = self._dirty.pop()
                now = self.clock()
                entry = f"{self.balancer.inflight[name]} {now + self.load_ttl_s:.3f}"
                self._written[name] = now
                await self.shared.put_field(f"load:{name}", self.replica, entry, TABLE_TTL_S)
        except Exception:  # noqa: BLE001 - a load write must never fail a request
            log.exception("shared load write failed")
