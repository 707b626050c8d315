"""The guard's verdicts per (route, tenant, move), shared by replicas through SharedState.

A move on a route is "trialling" until :func:`prefixgate.cache.guard.sequential.decide` turns it
"on" or "off"; the verdict then holds for ``ttl_s`` seconds (models change behind a route) and the
move is trialled afresh. While a verdict holds, pairs that arrive are ignored.

Keys (SharedState prefixes them; each part URL-quoted so that a ``:`` in a route or tenant name
cannot make two tenants' keys meet):

- ``guard:v:<route>:<tenant>:<move>``: the decided verdict as JSON (SharedState expiry ``ttl_s``;
  its ``expires_at`` is also checked against this book's clock);
- ``guard:c:<route>:<tenant>:<move>:packed``: the trial's four counts packed into ONE counter —
  pairs + move << 16 + floor << 32 + both << 48 — so that one INCRBY adds a pair's four counts
  atomically and a replica never reads a pair half-added (four separate counters could be read
  between two of their increments). The counter expires ``ttl_s`` after the last pair (an
  abandoned trial is forgotten) and is taken back to zero when a verdict is decided: a pair still
  in flight at that moment counts toward the next trial. Exactly one pair's increment returns a
  given count, so one caller decides a look; a pair that lands past ``max_pairs`` (while the
  final look is being decided) never decides, so the counter is reset once.

  A counter can still come to hold counts no trial can: below zero, more changed answers than
  pairs, or more than ``look_every`` pairs past ``max_pairs``. A reset meets another counter
  when the counter expired between a pair's increment and its reset, or when Redis went down or
  came back between them (RedisState answers from its local state while Redis is down); and a
  final look's decision is lost when its replica dies or its task is cancelled between the
  increment and the verdict's write. Such a counter reads as no pairs, and the next pair takes
  it back to zero (that pair is lost) rather than fail or wait "being decided" for ever. The
  take-back is a subtraction too: should it meet another counter in turn, what it leaves
  expires ``ttl_s`` after it like any count.

Tenants never read each other's keys; nothing stored names a prompt.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

from prefixgate.cache.guard.sequential import Decision, PairCounts, State, TestRule, decide
from prefixgate.cache.state.shared_state import SharedState

_SHIFT = 16
_MASK = (1 << _SHIFT) - 1
SNAPSHOT_CAP = 4096
"""Verdicts :meth:`GuardBook.snapshot` remembers (the most recently seen; tenants are many)."""
DAMAGED = ("the trial's counter held counts no trial can (a reset met another counter, or a decision "
           "was lost): taken back to zero")
"""The reason of the pair that finds its trial's counter so (module docstring)."""
_NO_PAIRS = PairCounts(0, 0, 0, 0)


@dataclass(frozen=True)
class MoveVerdict:
    """One move's standing on a (route, tenant): ``state``; ``pairs`` judged; changed rates of
    the move and of the floor; ``decided_at`` / ``expires_at`` (clock seconds, 0 while
    trialling); ``reason`` (one line, from the test)."""

    move: str
    state: State
    pairs: int
    move_rate: float
    floor_rate: float
    decided_at: float
    expires_at: float
    reason: str

    def header(self) -> str:
        """``trialling (12 pairs)`` | ``on (40 pairs, 0.00 vs floor 0.00)`` | ``off (...)``
        (``1 pair``)."""
        n = f"{self.pairs} pair" if self.pairs == 1 else f"{self.pairs} pairs"
        if self.state == "trialling":
            return f"trialling ({n})"
        return f"{self.state} ({n}, {self.move_rate:.2f} vs floor {self.floor_rate:.2f})"


def pack(move_changed: bool, floor_changed: bool) -> int:
    """One pair's increment of the packed counter (module docstring)."""
    both = move_changed and floor_changed
    return 1 + (int(move_changed) << _SHIFT) + (int(floor_changed) << 2 * _SHIFT) + (int(both) << 3 * _SHIFT)


def unpack(packed: int) -> PairCounts:
    """The four counts of a packed counter."""
    return PairCounts(packed & _MASK, (packed >> _SHIFT) & _MASK, (packed >> 2 * _SHIFT) & _MASK,
                      (packed >> 3 * _SHIFT) & _MASK)


def _counts(packed: int, rule: TestRule) -> PairCounts | None:
    """The counts of a trial's counter, or None where no trial can hold them (module docstring)."""
    c = unpack(packed)
    if packed < 0 or c.pairs > rule.max_pairs + rule.look_every \
            or c.both_changed > min(c.move_changed, c.floor_changed) \
            or c.move_changed + c.floor_changed - c.both_changed > c.pairs:
        return None
    return c


def _key(kind: str, route: str, tenant: str, move: str) -> str:
    return f"guard:{kind}:{quote(route, safe='')}:{quote(tenant, safe='')}:{quote(move, safe='')}"


def _trialling(move: str, d: Decision) -> MoveVerdict:
    return MoveVerdict(move, "trialling", d.pairs, d.move_rate, d.floor_rate, 0.0, 0.0, d.reason)


def _parse(raw: str | None) -> MoveVerdict | None:
    if raw is None:
        return None
    try:
        return MoveVerdict(**json.loads(raw))
    except (ValueError, TypeError):
        return None


class GuardBook:
    """Verdicts and trial counts per (route, tenant, move) over ``shared`` (module docstring).

    ``rule``: the sequential test; ``ttl_s``: how long a verdict holds; ``clock``: wall seconds
    (replicas compare ``expires_at``; tests pass a fake)."""

    def __init__(self, shared: SharedState, rule: TestRule, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if rule.max_pairs >= _MASK // 2:
            raise ValueError(f"max_pairs must be below {_MASK // 2} (packed counters)")
        self.shared, self.rule, self.ttl_s, self._clock = shared, rule, ttl_s, clock
        self._seen: OrderedDict[tuple[str, str, str], MoveVerdict] = OrderedDict()

    def _holding(self, stored: MoveVerdict | None) -> MoveVerdict | None:
        """``stored`` while it is a decided verdict not yet expired, else None."""
        if stored is None or stored.state == "trialling" or self._clock() >= stored.expires_at:
            return None
        return stored

    def _note(self, route: str, tenant: str, v: MoveVerdict) -> MoveVerdict:
        key = (route, tenant, v.move)
        self._seen[key] = v
        self._seen.move_to_end(key)
        while len(self._seen) > SNAPSHOT_CAP:
            self._seen.popitem(last=False)
        return v

    async def verdicts(self, route: str, tenant: str, moves: Sequence[str]) -> dict[str, MoveVerdict]:
        """Each of ``moves``' verdict on (``route``, ``tenant``), in one SharedState round trip.
        A verdict expired (or never decided) reads as "trialling" with the current trial's pairs."""
        names = [_key("v", route, tenant, m) for m in moves]
        names += [_key("c", route, tenant, m) + ":packed" for m in moves]
        vals, _ = await self.shared.read_many(names, [])
        out: dict[str, MoveVerdict] = {}
        for i, move in enumerate(moves):
            held = self._holding(_parse(vals[i]))
            if held is None:
                counts = _counts(int(vals[len(moves) + i] or 0), self.rule) or _NO_PAIRS
                held = _trialling(move, decide(counts, self.rule))
            out[move] = self._note(route, tenant, held)
        return out

    async def add_pair(self, route: str, tenant: str, move: str, move_changed: bool,
                       floor_changed: bool) -> MoveVerdict:
        """Count one trial pair and return the move's verdict; a decided verdict not yet expired
        is returned as it is and the pair ignored. At a decision the verdict is stored for
        ``ttl_s`` and the trial's counter taken back to zero."""
        vkey, ckey = _key("v", route, tenant, move), _key("c", route, tenant, move) + ":packed"
        vals, _ = await self.shared.read_many([vkey], [])
        held = self._holding(_parse(vals[0]))
        if held is not None:
            return self._note(route, tenant, held)
        packed = await self.shared.incr(ckey, pack(move_changed, floor_changed), self.ttl_s)
        counts = _counts(packed, self.rule)
        if counts is None:  # no trial can hold it: taken back to zero (module docstring)
            await self.shared.incr(ckey, -packed, self.ttl_s)
            return self._note(route, tenant, MoveVerdict(move, "trialling", 0, 0.0, 0.0, 0.0, 0.0, DAMAGED))
        d = decide(counts, self.rule)
        if d.state == "trialling":
            return self._note(route, tenant, _trialling(move, d))
        if counts.pairs > self.rule.max_pairs:  # the pair that reached it is deciding right now
            return self._note(route, tenant, MoveVerdict(
                move, "trialling", d.pairs, d.move_rate, d.floor_rate, 0.0, 0.0,
                f"past {self.rule.max_pairs} pairs: the last look is being decided"))
        now = self._clock()
        v = MoveVerdict(move, d.state, d.pairs, d.move_rate, d.floor_rate, now, now + self.ttl_s, d.reason)
        await self.shared.put(vkey, json.dumps(asdict(v)), self.ttl_s)
        await self.shared.incr(ckey, -packed, self.ttl_s)
        return self._note(route, tenant, v)

    def snapshot(self) -> list[dict[str, Any]]:
        """The verdicts this process has seen (the latest :data:`SNAPSHOT_CAP`), sorted by
        (route, tenant, move): route, tenant, move, state, pairs, move_rate, floor_rate, reason,
        expires_at. No prompt text: nothing here was read from one."""
        return [{"route": r, "tenant": t, "move": m, "state": v.state, "pairs": v.pairs,
                 "move_rate": v.move_rate, "floor_rate": v.floor_rate, "reason": v.reason,
                 "expires_at": v.expires_at}
                for (r, t, m), v in sorted(self._seen.items())]
