"""Think-time distributions for ``prefixgate simulate --think-time``: the gap before each request
of a run, drawn from a seeded RNG.

Specs:

* ``fixed:30s`` — always 30 seconds (units ``s``, ``m``, ``h``; a bare number is seconds).
* ``lognormal:MU,SIGMA`` — ``exp(N(MU, SIGMA))`` seconds (``MU``, ``SIGMA`` of the natural log
  of the gap; ``lognormal:4.5,1`` has a median of 90 s and ~13 % of gaps past 5 minutes).
* ``mix:tool=SPEC;user=SPEC`` — human in the loop: the gap before a request that ends with a
  tool result is the agent's own (``tool``: a tool ran), the gap before a request that ends with
  a user turn is a person's (``user``: reading and typing). Either side may be any non-mix spec.

:func:`parse` raises ``ValueError`` with the reason for a bad spec.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    t = text.strip().lower()
    mult = UNITS.get(t[-1:], None)
    value = float(t[:-1] if mult else t) * (mult or 1.0)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a gap must be a non-negative number of seconds, not {text!r}")
    return value


@dataclass(frozen=True)
class ThinkTime:
    """A parsed spec: ``kind`` is ``"fixed" | "lognormal" | "mix"``; ``a``/``b`` its numbers
    (seconds; or MU, SIGMA); ``tool``/``user`` the two sides of a mix."""

    spec: str
    kind: str
    a: float = 0.0
    b: float = 0.0
    tool: ThinkTime | None = None
    user: ThinkTime | None = None

    def sample(self, rng: random.Random, request_kind: str = "user") -> float:
        """One gap in seconds before a request of ``request_kind`` (``"tool"`` | ``"user"``)."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "lognormal":
            return math.exp(rng.gauss(self.a, self.b))
        side = self.tool if request_kind == "tool" else self.user
        assert side is not None
        return side.sample(rng, request_kind)


def parse(spec: str) -> ThinkTime:
    """A :class:`ThinkTime` from its spec (module docstring); ``ValueError`` when malformed."""
    name, _, rest = spec.strip().partition(":")
    try:
        if name == "fixed":
            return ThinkTime(spec, "fixed", _seconds(rest))
        if name == "lognormal":
            mu, sigma = (float(x) for x in rest.split(","))
            if not (math.isfinite(mu) and math.isfinite(sigma) and sigma >= 0):
                raise ValueError("MU and SIGMA must be finite, SIGMA >= 0")
            return ThinkTime(spec, "lognormal", mu, sigma)
        if name == "mix":
            sides: dict[str, Any] = {}
            for part in rest.split(";"):
                key, _, sub = part.partition("=")
                if key.strip() not in ("tool", "user") or sub.strip().startswith("mix"):
                    raise ValueError(f"mix side {part!r}: expected tool=SPEC or user=SPEC")
                sides[key.strip()] = parse(sub)
            if set(sides) != {"tool", "user"}:
                raise ValueError("mix needs both tool=SPEC and user=SPEC")
            return ThinkTime(spec, "mix", tool=sides["tool"], user=sides["user"])
    except ValueError as e:
        raise ValueError(f"bad think time {spec!r}: {e}") from None
    raise ValueError(f"bad think time {spec!r}: expected fixed:30s, lognormal:MU,SIGMA or "
                     "mix:tool=SPEC;user=SPEC")


def message_kind(messages: list[dict[str, Any]]) -> str:
    """``"tool"`` when the newest message is a tool result (either API's shape), else ``"user"``."""
    if not messages:
        return "user"
    last = messages[-1]
    if last.get("role") == "tool":
        return "tool"
    content = last.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result"
                                         for b in content):
        return "tool"
    return "user"
