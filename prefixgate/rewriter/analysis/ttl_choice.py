"""Cache-write TTL chosen by expected cost, from the session's measured inter-arrival times.

Prices (Anthropic, https://platform.claude.com/docs/en/build-with-claude/prompt-caching,
"Pricing", read 2026-11-29), per token, in units of the base input price: a 5-minute write costs
:data:`WRITE_5M` = 1.25, a 1-hour write :data:`WRITE_1H` = 2.0, a read :data:`READ` = 0.1.
A read more than 5 minutes after the write needs the 1-hour write; past the TTL the prefix is
written again.

Expected cost, per breakpoint. The breakpoints of a request cut its cached prefix into segments
(segment ``i``: the tokens from breakpoint ``i-1`` to breakpoint ``i``, ``n`` of them, ``d`` of
which this request writes — the rest was cached by the session's previous request). With
``p(T)`` the probability that the next request comes more than ``T`` after this one, a segment
with TTL ``T`` costs::

    E(T) = write(T) * d + n * ((1 - p(T)) * READ + p(T) * write(T))

— the write now, then on the next request a read of the whole segment while its entry lives, or
a new write of it once expired. The request's TTLs must be 1h before 5m (the API rejects the
other order), so :func:`plan` tries each split (the first ``j`` breakpoints 1h, the rest 5m)
and keeps the cheapest: a long system prompt re-read after a coffee break is worth a 1h write
even when the conversation tail after it is not.

``p(T)`` comes from a lognormal fitted to the measured gaps (mean and standard deviation of their
natural logs, the deviation at least :data:`MIN_LOG_SIGMA`): a handful of gaps rarely shows the
tail past 5 minutes that a human in the loop produces, and the fit prices it from their spread.

A session that has ended sends no next request and so records no gap (an ended session would
need no write at all; the proxy cannot know a session has ended when its last request arrives,
so that case is not priced). With fewer than :data:`MIN_SAMPLES` gaps every breakpoint gets
``"5m"`` (the API's default). Ties go to 5m.

Assumption (the simulator's Anthropic model, ``prefixgate/cache/provider_models/anthropic.py``): a segment
the previous request cached under a 5m marker and re-marked 1h now is read and its entry kept
for the longer TTL, not written again (``d = 0``); a hit refreshes an entry at no cost.

Gaps are kept per *kind* of the request that preceded them (:func:`request_kind`): an agent's
request that ends with a tool result is usually answered by another tool call within seconds, a
request that ends with the user's own turn waits for a human. When a kind has at least
:data:`MIN_SAMPLES` gaps of its own, those decide; else all gaps together.

Memory (``Edit.memory["arrivals"]``): ``{"t": last request's time (s), "k": its kind,
"g": {"tool": [gaps], "user": [gaps]}}``, gaps rounded to 0.1 s, the newest
:data:`MAX_GAPS` per kind. Times only, never text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from prefixgate.rewriter.wire.ir import Prompt

Ttl = Literal["5m", "1h"]
MEMORY_KEY = "arrivals"
WRITE_5M = 1.25
WRITE_1H = 2.0
READ = 0.1
TTL_S: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
WRITE: dict[str, float] = {"5m": WRITE_5M, "1h": WRITE_1H}
MIN_SAMPLES = 3
MIN_LOG_SIGMA = 0.25
MAX_GAPS = 32
KINDS = ("tool", "user")


def request_kind(prompt: Prompt) -> str:
    """``"tool"`` when the newest message carries a tool result (the agent's loop), else
    ``"user"`` (a human's turn, or anything else)."""
    if not prompt.messages:
        return "user"
    last = prompt.messages[-1]
    if last.role == "tool" or any(b.type == "tool_result" for b in last.blocks):
        return "tool"
    return "user"


def tail(gaps: Sequence[float], after_s: float) -> float:
    """``p(T)``: probability of a gap longer than ``after_s`` under the lognormal fitted to
    ``gaps`` (seconds, at least 2; gaps under 1 s count as 1 s)."""
    logs = [math.log(max(1.0, g)) for g in gaps]
    mu = sum(logs) / len(logs)
    var = sum((x - mu) ** 2 for x in logs) / max(1, len(logs) - 1)
    sigma = max(MIN_LOG_SIGMA, math.sqrt(var))
    return 0.5 * math.erfc((math.log(after_s) - mu) / (sigma * math.sqrt(2)))


def segment_cost(ttl: str, n: int, d: int, gaps: Sequence[float]) -> float:
    """``E(T)`` of the module docstring for one segment of ``n`` tokens of which ``d`` are
    written now, in base-input-token units (``gaps``: at least 2, seconds)."""
    w, p = WRITE[ttl], tail(gaps, TTL_S[ttl])
    return w * d + n * ((1 - p) * READ + p * w)


def samples(mem: Any, kind: str) -> list[float]:
    """The gaps that decide for a request of ``kind`` (module docstring); ``[]`` if too few."""
    g = mem.get("g") if isinstance(mem, Mapping) else None
    if not isinstance(g, Mapping):
        return []
    own = [float(x) for x in g.get(kind) or [] if isinstance(x, (int, float))]
    if len(own) >= MIN_SAMPLES:
        return own
    pooled = [float(x) for k in KINDS for x in g.get(k) or [] if isinstance(x, (int, float))]
    return pooled if len(pooled) >= MIN_SAMPLES else []


def plan(segments: Sequence[tuple[int, int]], gaps: Sequence[float]) -> tuple[list[Ttl], str]:
    """``(ttl per breakpoint, why)`` for breakpoints whose segments are ``(n, d)`` in prefix
    order: the cheapest split into 1h breakpoints then 5m ones (module docstring)."""
    k = len(segments)
    if len(gaps) < MIN_SAMPLES or not k:
        default: list[Ttl] = ["5m"]
        return default * k, f"ttl 5m: {len(gaps)} gap(s) measured"
    c5 = [segment_cost("5m", n, d, gaps) for n, d in segments]
    c1 = [segment_cost("1h", n, d, gaps) for n, d in segments]
    costs = [sum(c1[:j]) + sum(c5[j:]) for j in range(k + 1)]
    best = min(range(k + 1), key=lambda j: (costs[j], j))
    one_h: list[Ttl] = ["1h"]
    five_m: list[Ttl] = ["5m"]
    ttls = one_h * best + five_m * (k - best)
    return ttls, (f"ttl {best} x 1h then {k - best} x 5m: expected cost {costs[best]:.0f} "
                  f"vs all-5m {costs[0]:.0f}, all-1h {costs[k]:.0f} over {len(gaps)} gaps")


def updated(mem: Any, now_s: float, kind: str) -> dict[str, Any]:
    """The arrivals memory after a request of ``kind`` at ``now_s``: the gap since the previous
    request is filed under the previous request's kind."""
    old = mem if isinstance(mem, Mapping) else {}
    g_raw = old.get("g")
    g_old: Mapping[str, Any] = g_raw if isinstance(g_raw, Mapping) else {}
    g = {k: [float(x) for x in (g_old.get(k) or []) if isinstance(x, (int, float))]
         for k in KINDS}
    last, last_kind = old.get("t"), old.get("k")
    if isinstance(last, (int, float)) and now_s >= last and last_kind in KINDS:
        g[str(last_kind)] = [*g[str(last_kind)], round(now_s - float(last), 1)][-MAX_GAPS:]
    return {"t": now_s, "k": kind, "g": g}
