"""The wall clock of a replayed request (``prefixgate replay --volatile-clock``). Traces are
read by :mod:`prefixgate.proxy.sim.traces` (tau-bench JSON, SWE-agent ``.traj``).

The tau-bench airline system prompt carries a fixed clock line, ``The current time is 2024-05-15 15:00:00
EST.``; :func:`with_wall_clock` replaces it with the time of sending, which is what a real agent
does and what breaks naive prefix caching (case B03).
"""

from __future__ import annotations

import re
import time
from typing import Any

CLOCK_RE = re.compile(r"The current time is \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z]{2,4}\.")


def with_wall_clock(body: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """A copy of ``body`` whose system-prompt clock line shows ``now`` (default: the current
    local time, second resolution). Only the first system message is touched."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    msgs = list(body["messages"])
    for i, m in enumerate(msgs):
        if m.get("role") == "system" and isinstance(m.get("content"), str):
            msgs[i] = {**m, "content": CLOCK_RE.sub(f"The current time is {stamp} EST.",
                                                    m["content"], count=1)}
            break
    return {**body, "messages": msgs}
