"""Small state shared by proxy replicas: counters and short values with expiry.

The interface later parts of the proxy build on (issue 10: a circuit breaker per deployment,
prefix-affinity load counters) without knowing whether state is shared:

- :meth:`SharedState.incr` ``(name, by=1, ttl_s=None) -> int``: add ``by`` (may be negative) to a
  counter and return its new value; ``ttl_s`` (seconds) sets the counter's expiry on every call
  (a sliding window: a breaker's "failures in the last 30 s" is ``incr(f"fail:{dep}", 1, 30)``;
  an in-flight load counter is ``incr(f"load:{dep}", +1)`` at the send, ``-1`` at the end);
- :meth:`SharedState.count` ``(name) -> int``: the counter now (0 when absent or expired);
- :meth:`SharedState.put` ``(name, value, ttl_s=None)`` / :meth:`SharedState.get`
  ``(name) -> str | None``: a short string value (a breaker's ``open`` / ``half_open`` with its
  cooldown as ``ttl_s``);
- :meth:`SharedState.put_field` ``(name, field, value, ttl_s=None)``: one field of a small table
  (a Redis hash; ``ttl_s`` is the whole table's expiry, refreshed on every call) — one replica's
  entry in a deployment's load table;
- :meth:`SharedState.read_many` ``(values, tables) -> (list[str | None], list[dict[str, str]])``:
  several values and tables in ONE round trip (a pipeline) — what routing reads before a send.

Two implementations: :class:`LocalState` (one process, the default) and :class:`RedisState` (keys
``<prefix>state:<name>`` through :class:`prefixgate.cache.state.redis_link.RedisLink`). While Redis
is down a RedisState answers from its own LocalState — each replica then counts alone, which is the
right degradation for breakers and load guards — and is back on Redis when Redis is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prefixgate.cache.state.redis_link import RedisLink

_DOWN: Any = object()


class SharedState(Protocol):
    """Counters and values shared by replicas (module docstring)."""

    async def incr(self, name: str, by: int = 1, ttl_s: float | None = None) -> int:
        """Add ``by`` to counter ``name``; return the new value."""
        ...

    async def count(self, name: str) -> int:
        """Counter ``name`` (0 when absent)."""
        ...

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        """Set value ``name``, expiring after ``ttl_s`` seconds (None: never)."""
        ...

    async def get(self, name: str) -> str | None:
        """Value ``name`` (None when absent or expired)."""
        ...

    async def put_field(self, name: str, field: str, value: str,
                        ttl_s: float | None = None) -> None:
        """Set ``field`` of table ``name``; the table expires ``ttl_s`` seconds after."""
        ...

    async def read_many(self, values: Sequence[str], tables: Sequence[str]
                        ) -> tuple[list[str | None], list[dict[str, str]]]:
        """Values ``values`` and tables ``tables`` (absent: None / {}), in one round trip."""
        ...


class LocalState:
    """In-process :class:`SharedState`; ``clock``: monotonic seconds (tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: dict[str, tuple[Any, float | None]] = {}

    def _live(self, name: str) -> Any:
        item = self._items.get(name)
        if item is None:
            return None
        value, expires = item
        if expires is not None and self._clock() >= expires:
            del self._items[name]
            return None
        return value

    def _expiry(self, name: str, ttl_s: float | None) -> float | None:
        if ttl_s is not None:
            return self._clock() + ttl_s
        item = self._items.get(name)
        return item[1] if item else None

    async def incr(self, name: str, by: int = 1, ttl_s: float | None = None) -> int:
        """Add ``by``; return the new value (``ttl_s`` refreshes the expiry)."""
        value = int(self._live(name) or 0) + by
        self._items[name] = (value, self._expiry(name, ttl_s))
        return value

    async def count(self, name: str) -> int:
        """The counter (0 when absent or expired)."""
        return int(self._live(name) or 0)

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        """Set a value."""
        self._items[name] = (value, None if ttl_s is None else self._clock() + ttl_s)

    async def get(self, name: str) -> str | None:
        """The value, or None."""
        v = self._live(name)
        return None if v is None else str(v)

    async def put_field(self, name: str, field: str, value: str,
                        ttl_s: float | None = None) -> None:
        """Set one field of a table."""
        table = self._live(name)
        table = dict(table) if isinstance(table, dict) else {}
        table[field] = value
        self._items[name] = (table, self._expiry(name, ttl_s))

    async def read_many(self, values: Sequence[str], tables: Sequence[str]
                        ) -> tuple[list[str | None], list[dict[str, str]]]:
        """Values and tables by name."""
        vals = [await self.get(n) for n in values]
        tabs = []
        for n in tables:
            t = self._live(n)
            tabs.append(dict(t) if isinstance(t, dict) else {})
        return vals, tabs


class RedisState:
    """:class:`SharedState` in Redis behind ``link``; ``local`` answers while it is down."""

    def __init__(self, link: RedisLink, local: LocalState | None = None) -> None:
        self.link = link
        self.local = local if local is not None else LocalState()

    def _key(self, name: str) -> str:
        return self.link.key("state", name)

    async def incr(self, name: str, by: int = 1, ttl_s: float | None = None) -> int:
        """INCRBY (+ PEXPIRE when ``ttl_s``) in one transaction."""
        async def op(r: Any) -> int:
            async with r.pipeline(transaction=True) as p:
                p.incrby(self._key(name), by)
                if ttl_s is not None:
                    p.pexpire(self._key(name), max(1, int(ttl_s * 1000)))
                return int((await p.execute())[0])
        got = await self.link.run(op, _DOWN)
        return await self.local.incr(name, by, ttl_s) if got is _DOWN else int(got)

    async def count(self, name: str) -> int:
        """GET as an integer."""
        got = await self.link.run(lambda r: r.get(self._key(name)), _DOWN)
        if got is _DOWN:
            return await self.local.count(name)
        return int(got) if got is not None else 0

    async def put(self, name: str, value: str, ttl_s: float | None = None) -> None:
        """SET (PX when ``ttl_s``); kept locally too."""
        await self.local.put(name, value, ttl_s)
        px = None if ttl_s is None else max(1, int(ttl_s * 1000))
        await self.link.run(lambda r: r.set(self._key(name), value, px=px), None)

    async def get(self, name: str) -> str | None:
        """GET as text."""
        got = await self.link.run(lambda r: r.get(self._key(name)), _DOWN)
        if got is _DOWN:
            return await self.local.get(name)
        return None if got is None else got.decode("utf-8", "replace")

    async def put_field(self, name: str, field: str, value: str,
                        ttl_s: float | None = None) -> None:
        """HSET (+ PEXPIRE on the table when ``ttl_s``) in one transaction; kept locally too."""
        await self.local.put_field(name, field, value, ttl_s)

        async def op(r: Any) -> None:
            async with r.pipeline(transaction=True) as p:
                p.hset(self._key(name), field, value)
                if ttl_s is not None:
                    p.pexpire(self._key(name), max(1, int(ttl_s * 1000)))
                await p.execute()
        await self.link.run(op, None)

    async def read_many(self, values: Sequence[str], tables: Sequence[str]
                        ) -> tuple[list[str | None], list[dict[str, str]]]:
        """MGET + one HGETALL per table, pipelined (one round trip)."""
        async def op(r: Any) -> Any:
            async with r.pipeline(transaction=False) as p:
                if values:
                    p.mget([self._key(n) for n in values])
                for n in tables:
                    p.hgetall(self._key(n))
                return await p.execute()
        got = await self.link.run(op, _DOWN)
        if got is _DOWN:
            return await self.local.read_many(values, tables)
        raw_vals = got[0] if values else []
        vals = [None if v is None else v.decode("utf-8", "replace") for v in raw_vals]
        tabs = [{k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                 for k, v in t.items()} for t in got[1 if values else 0:]]
        return vals, tabs
