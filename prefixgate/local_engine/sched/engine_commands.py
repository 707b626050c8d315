"""The commands callers put on the engine's queue (:mod:`prefixgate.local_engine.engine`): each is
handled on the engine thread between steps, in the order queued."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefixgate.local_engine.sched.sequence import Sequence


@dataclass(frozen=True)
class AddCmd:
    """Queue ``seq`` for admission, after emitting its ``given`` tokens (``_take_given``)."""

    seq: Sequence
    given: tuple[int, ...] = ()


@dataclass(frozen=True)
class AbortCmd:
    """Abort the request ``request_id`` (waiting or running; unknown ids are ignored)."""

    request_id: str


@dataclass(frozen=True)
class StopCmd:
    """Abort everything and end the step loop."""


@dataclass(frozen=True)
class ResetCacheCmd:
    """Empty the radix tree if no request holds any of it; ``done`` gets whether it did."""

    done: Callable[[bool], None]


@dataclass(frozen=True)
class CallCmd:
    """Run ``fn()`` on the engine thread between steps; its result or exception goes to
    ``future`` (P/D KV import / export touch the pool and the radix tree, which only the engine
    thread may change). A ``paced`` call, while requests run, waits for the next step and
    shares no step gap with another paced call (one runs after each step, in the order
    queued): work split into paced calls delays each running decode by one piece at most."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]
    paced: bool = False


Command = AddCmd | AbortCmd | StopCmd | ResetCacheCmd | CallCmd
