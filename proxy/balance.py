"""Which deployment of a group serves a request: prefix affinity under a load guard (issue 10,
item 4).

The rule is SGLang's cache-aware router's two parts (sgl-router ``cache_aware`` policy): while
the group is balanced, route for the cache; once it is not — ``max - min > imbalance_abs`` and
``max > imbalance_rel * min``, load = requests in flight from this proxy — route to the least
loaded deployment. Routing for the cache is, by ``AffinitySettings.mode``:

- ``prefix``: rendezvous (highest-random-weight) hashing of the request's affinity key over the
  available deployments: the same key always lands on the same deployment, and when one
  deployment leaves only its keys move. The key is the session id (:mod:`proxy.rewriting`:
  hash of the system text and the first user message unless the client names its session), so
  a conversation's growing prefix keeps meeting its own KV cache.
- ``exact``: each deployment said how many tokens of this prompt its radix tree holds
  (``POST /cache/match``, :func:`choose` gets ``matches``); the longest match wins, rendezvous
  breaks ties and decides when nothing matches.
- ``least_load`` / ``round_robin``: no affinity (the baselines of ``bench/routing_affinity.py``).

:func:`choose` is pure; :class:`Balancer` keeps the in-flight counts and the round-robin turn.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from config.routing import AffinitySettings


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
           turn: int = 0, matches: Sequence[int] | None = None) -> Choice:
    """The deployment for one request (see module docstring). ``names``, ``loads`` (in
    flight) and ``matches`` (cached tokens, ``exact`` mode) are parallel; ``turn``: the
    round-robin counter."""
    if len(names) == 1:
        return Choice(0, "single")
    mode = settings.mode
    if mode == "round_robin":
        return Choice(turn % len(names), "round_robin")
    if mode == "least_load":
        return Choice(_least(loads, key, names), "least_load")
    if imbalanced(loads, settings.imbalance_abs, settings.imbalance_rel):
        return Choice(_least(loads, key, names), "load_guard")
    if mode == "exact" and matches is not None and max(matches) > 0:
        best = max(matches)
        tied = [i for i, m in enumerate(matches) if m == best]
        return Choice(tied[rendezvous(key, [names[i] for i in tied])], "cache_match")
    return Choice(rendezvous(key, names), "affinity")


class Balancer:
    """In-flight requests per deployment (this proxy's) and the round-robin turns."""

    def __init__(self) -> None:
        self.inflight: collections.Counter[str] = collections.Counter()
        self.served: collections.Counter[tuple[str, str]] = collections.Counter()
        self._turns: dict[str, itertools.count[int]] = {}

    def turn(self, group: str) -> int:
        """The next round-robin turn of ``group``."""
        return next(self._turns.setdefault(group, itertools.count()))

    def loads(self, names: Sequence[str]) -> list[int]:
        """In-flight counts of ``names``."""
        return [self.inflight[n] for n in names]

    def acquire(self, name: str, why: str = "") -> Callable[[], None]:
        """Count one request in flight on ``name``; returns its release (idempotent)."""
        self.inflight[name] += 1
        self.served[(name, why)] += 1
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.inflight[name] -= 1
        return release
