"""Which deployment of a group serves a request: prefix affinity under a load guard (issue 10,
item 4).

The rule is SGLang's cache-aware router's two parts (sgl-router ``cache_aware`` policy): while
the group is balanced, route for the cache; once it is not — ``max - min > imbalance_abs`` and
``max > imbalance_rel * min``, load = requests in flight from this proxy — route to the least
loaded deployment. Routing for the cache is, by ``AffinitySettings.mode``:

- ``prefix``: the request's affinity key is placed once and kept: a new key goes to the first
  deployment in its rendezvous (highest-random-weight) order that holds fewer than
  ``ceil(session_balance * mean)`` live keys — consistent hashing with bounded loads (Mirrokni,
  Thorup, Zadimoghaddam, SODA 2018; HAProxy's ``hash-balance-factor``) — and every later
  request of that key goes where the key was placed. So sessions are spread evenly even when
  there are few of them, and a conversation's growing prefix keeps meeting its own KV cache.
  A key is live while it was seen in the last ``session_ttl_s``; keys are kept per proxy
  process (at most :data:`MAX_KEYS`, oldest forgotten first). The key is the session id
  (:mod:`prefixgate.proxy.pipeline.rewrite`: hash of the system text and the first user message unless the
  client names its session).
- ``exact``: each deployment said how many tokens of this prompt its radix tree holds
  (``POST /cache/match``, or the router's block index fed by the deployments' KV events,
  :mod:`prefixgate.proxy.routing.kv_events`; :func:`choose` gets ``matches``); the longest
  match wins; among tied longest matches the key's placement wins when it is one of them (a
  system prompt every replica holds must not undo the bounded-load placement), else
  rendezvous; the placement decides when nothing matches. A **new key** (its first request
  through this process) follows its placement whatever matches: a conversation not seen yet
  holds no history anywhere, so what it matches is a prefix other conversations left (the
  system prompt, the tools), which the placed replica computes once and then holds for every
  later key — following the match instead piles every new conversation onto the first replica
  to hold that prefix, for good (live, 3 engines: the one-replica oracle minus one system
  prompt per extra replica is the bound, ``bench/kv_routing.py``). Once a key's request went
  to another deployment for its match (its history is there: the load guard moved a turn, a
  restart lost the placement), the placement follows it (:meth:`Balancer.follow`).
- ``least_load`` / ``round_robin``: no affinity (the baselines of ``bench/routing_affinity.py``).

:func:`choose` is pure; :class:`Balancer` keeps the in-flight counts and the round-robin turn.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefixgate.config.routing import AffinitySettings
from prefixgate.proxy.routing.slots import SlotTable


@dataclass(frozen=True)
class Choice:
    """``index`` into the names given to :func:`choose`; ``why``: ``affinity``,
    ``cache_match``, ``load_guard``, ``least_load``, ``round_robin`` or ``single``."""

    index: int
    why: str


def rendezvous(key: str, names: Sequence[str]) -> int:
    """Index of the name with the highest ``sha256(key | name)`` (ties: the first)."""
    scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:8] for n in names]
    return max(range(len(names)), key=lambda i: scores[i])


def imbalanced(loads: Sequence[int], abs_gap: int, rel: float) -> bool:
    """SGLang's test: ``max - min > abs_gap`` and ``max > rel * min``."""
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_gap and hi > rel * lo


def _least(loads: Sequence[int], tie_key: str, names: Sequence[str]) -> int:
    lo = min(loads)
    tied = [i for i, x in enumerate(loads) if x == lo]
    return tied[rendezvous(tie_key, [names[i] for i in tied])]


def choose(names: Sequence[str], loads: Sequence[int], key: str, settings: AffinitySettings,
           turn: int = 0, matches: Sequence[int] | None = None,
           placed: int | None = None, new_key: bool = False) -> Choice:
    """The deployment for one request (see module docstring). ``names``, ``loads`` (in
    flight) and ``matches`` (cached tokens, ``exact`` mode) are parallel; ``turn``: the
    round-robin counter; ``placed``: where the key was placed (:meth:`Balancer.place`; None:
    plain rendezvous); ``new_key``: the key's first request here (with ``placed``, the
    placement decides, ``matches`` aside)."""
    if len(names) == 1:
        return Choice(0, "single")
    mode = settings.mode
    if mode == "round_robin":
        return Choice(turn % len(names), "round_robin")
    if mode == "least_load":  # ties in turn, not by key: no affinity at all
        lo = min(loads)
        tied = [i for i, x in enumerate(loads) if x == lo]
        return Choice(tied[turn % len(tied)], "least_load")
    if imbalanced(loads, settings.imbalance_abs, settings.imbalance_rel):
        return Choice(_least(loads, key, names), "load_guard")
    if new_key and placed is not None:
        return Choice(placed, "affinity")
    if mode == "exact" and matches is not None and max(matches) > 0:
        best = max(matches)
        tied = [i for i, m in enumerate(matches) if m == best]
        if placed in tied:  # a prefix every deployment holds (a shared system prompt): placement
            return Choice(placed, "cache_match")
        return Choice(tied[rendezvous(key, [names[i] for i in tied])], "cache_match")
    return Choice(rendezvous(key, names) if placed is None else placed, "affinity")


MAX_KEYS = 100_000  # affinity keys remembered per proxy process


def rendezvous_order(key: str, names: Sequence[str]) -> list[int]:
    """Indices of ``names`` by decreasing ``sha256(key | name)``."""
    scores = [hashlib.sha256(f"{key}|{n}".encode()).digest()[:8] for n in names]
    return sorted(range(len(names)), key=lambda i: scores[i], reverse=True)


class Balancer:
    """In-flight requests per deployment (this proxy's), the round-robin turns, where each
    affinity key was placed, and (``slots``) which llama.cpp slot each key holds. ``now``:
    seconds, monotonic (injectable)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self.inflight: collections.Counter[str] = collections.Counter()
        self.served: collections.Counter[tuple[str, str]] = collections.Counter()
        self._turns: dict[str, itertools.count[int]] = {}
        self._keys: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self._live: collections.Counter[str] = collections.Counter()
        self.now = now
        self.others: dict[str, int] = {}  # other replicas' in flight (routing.shared)
        self.on_change: Callable[[str], None] | None = None  # an in-flight count changed
        self.slots = SlotTable(now=now)

    def place(self, key: str, names: Sequence[str], settings: AffinitySettings) -> int:
        """Index in ``names`` where ``key`` goes (see module docstring): where it was placed
        while that deployment is among ``names``, else the first in its rendezvous order
        under the bounded load."""
        now = self.now()
        self._forget(now - settings.session_ttl_s)
        held = self._keys.pop(key, None)
        if held is not None:
            self._live[held[0]] -= 1
            if held[0] in names:
                return self._keep(key, held[0], names, now)
        total = sum(self._live[n] for n in names) + 1
        cap = math.ceil(settings.session_balance * total / len(names))
        order = rendezvous_order(key, names)
        pick = next((i for i in order if self._live[names[i]] < cap), order[0])
        return self._keep(key, names[pick], names, now)

    def known(self, key: str, settings: AffinitySettings) -> bool:
        """Whether ``key`` holds a placement seen within ``settings.session_ttl_s`` (its next
        :meth:`place` keeps it)."""
        held = self._keys.get(key)
        return held is not None and held[1] >= self.now() - settings.session_ttl_s

    def follow(self, key: str, name: str) -> None:
        """Move ``key``'s placement to ``name`` (its conversation's cache went there: an
        ``exact`` match chose it over the placement). Nothing when ``key`` holds none."""
        held = self._keys.get(key)
        if held is None or held[0] == name:
            return
        self._live[held[0]] -= 1
        self._live[name] += 1
        self._keys[key] = (name, held[1])

    def _keep(self, key: str, name: str, names: Sequence[str], now: float) -> int:
        self._keys[key] = (name, now)
        self._live[name] += 1
        if len(self._keys) > MAX_KEYS:
            old, _ = self._keys.popitem(last=False)[1]
            self._live[old] -= 1
        return list(names).index(name)

    def _forget(self, before: float) -> None:
        while self._keys:
            name, seen = next(iter(self._keys.values()))
            if seen >= before:
                return
            self._keys.popitem(last=False)
            self._live[name] -= 1

    def turn(self, group: str) -> int:
        """The next round-robin turn of ``group``."""
        return next(self._turns.setdefault(group, itertools.count()))

    def loads(self, names: Sequence[str]) -> list[int]:
        """In-flight counts of ``names``: this proxy's plus, with shared state, the other
        replicas' last read (:mod:`prefixgate.proxy.routing.shared`)."""
        if not self.others:
            return [self.inflight[n] for n in names]
        return [self.inflight[n] + self.others.get(n, 0) for n in names]

    def acquire(self, name: str, why: str = "") -> Callable[[], None]:
        """Count one request in flight on ``name``; returns its release (idempotent)."""
        self.inflight[name] += 1
        self.served[(name, why)] += 1
        if self.on_change is not None:
            self.on_change(name)
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.inflight[name] -= 1
                if self.on_change is not None:
                    self.on_change(name)
        return release
