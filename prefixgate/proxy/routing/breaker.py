"""A circuit breaker per deployment (issue 10, item 3).

States: ``closed`` (requests flow), ``open`` (the deployment is skipped while another can
serve, for ``cooldown_s``), ``half_open`` (the cooldown is over: one probe request is let
through; its success closes the breaker, its failure opens it again for another cooldown).

It opens on ``consecutive_failures`` failures in a row, or when the outcomes of the last
``window_s`` seconds number at least ``min_requests`` and hold a failure share of at least
``error_rate`` (Envoy's consecutive-5xx and success-rate outlier detection, in one object).

The clock is injectable (``now``: seconds, monotonic), so tests step time instead of sleeping.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefixgate.config.routing import BreakerSettings

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class Breaker:
    """One deployment's breaker (see module docstring). Not thread-safe: the event loop's."""

    settings: BreakerSettings
    now: Callable[[], float] = time.monotonic
    state: str = CLOSED
    consecutive: int = 0
    opened_at: float = 0.0
    probing: bool = False
    last_reason: str = ""
    outcomes: collections.deque[tuple[float, bool]] = field(
        default_factory=collections.deque)

    def available(self) -> bool:
        """Whether a request may go to this deployment now (no side effect)."""
        if not self.settings.enabled or self.state == CLOSED:
            return True
        if self.state == OPEN:
            return self.now() - self.opened_at >= self.settings.cooldown_s
        return not self.probing  # half-open: one probe at a time

    def before_send(self) -> None:
        """Note that a request is about to go out (an open breaker past its cooldown turns
        half-open and this request is its probe)."""
        if self.state == OPEN and self.now() - self.opened_at >= self.settings.cooldown_s:
            self.state = HALF_OPEN
        if self.state == HALF_OPEN:
            self.probing = True

    def abandoned(self) -> None:
        """The request sent by :meth:`before_send` ended with no verdict (the client left):
        a half-open breaker may send its probe again."""
        self.probing = False

    def success(self) -> None:
        """The deployment answered (any status that is not a failure, see BreakerSettings)."""
        self._note(True)
        self.consecutive = 0
        if self.state != CLOSED:
            self.state, self.probing, self.last_reason = CLOSED, False, ""

    def failure(self, reason: str) -> None:
        """The deployment failed (``reason``: e.g. ``status-503``, ``connect``)."""
        self._note(False)
        self.consecutive += 1
        self.last_reason = reason
        if self.state == HALF_OPEN or self._tripped():
            self.state, self.opened_at, self.probing = OPEN, self.now(), False

    def open_from_peer(self, reason: str, age_s: float) -> None:
        """Another replica opened this deployment's breaker ``age_s`` seconds ago
        (:mod:`prefixgate.proxy.routing.shared`): a closed breaker, or one open here since earlier, opens
        with the rest of that cooldown; a half-open one (its probe in flight) is left alone."""
        opened_at = self.now() - max(0.0, age_s)
        if self.settings.enabled and (self.state == CLOSED
                                      or (self.state == OPEN and opened_at > self.opened_at)):
            self.state, self.probing = OPEN, False
            self.opened_at, self.last_reason = opened_at, reason

    def close_from_peer(self) -> None:
        """Another replica's probe succeeded: an open breaker here closes (a half-open one waits
        for its own probe)."""
        if self.state == OPEN:
            self.state, self.consecutive, self.last_reason = CLOSED, 0, ""

    def _note(self, ok: bool) -> None:
        now = self.now()
        self.outcomes.append((now, ok))
        while self.outcomes and self.outcomes[0][0] < now - self.settings.window_s:
            self.outcomes.popleft()

    def _tripped(self) -> bool:
        if not self.settings.enabled:
            return False
        if self.consecutive >= self.settings.consecutive_failures:
            return True
        n = len(self.outcomes)
        bad = sum(1 for _, ok in self.outcomes if not ok)
        return n >= self.settings.min_requests and bad >= self.settings.error_rate * n


class BreakerBoard:
    """The breakers of every deployment, by deployment name, made on first use."""

    def __init__(self, settings: BreakerSettings,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.now = settings, now
        self._by_name: dict[str, Breaker] = {}

    def get(self, name: str) -> Breaker:
        """The breaker of deployment ``name``."""
        b = self._by_name.get(name)
        if b is None:
            b = self._by_name[name] = Breaker(self.settings, self.now)
        return b

    def down(self) -> dict[str, str]:
        """``{deployment: reason}`` for every breaker not closed (open or half-open)."""
        return {n: f"{b.state}: {b.last_reason}" for n, b in sorted(self._by_name.items())
                if b.state != CLOSED}
