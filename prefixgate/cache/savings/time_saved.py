"""Prefill time saved on self-hosted backends (issue 19, item 8), from ledger rows.

A self-hosted engine bills no tokens: what a prefix-cache hit saves there is prefill time. Per
(route, backend) — one engine and its model, so one prefill rate:

**Rate** (ms of prefill per uncached prompt token). Samples: the group's ``ok`` rows with
``prompt_tokens``, ``cached_tokens``, at least :data:`MIN_UNCACHED` uncached tokens
(``prompt - cached``) and the engine's own prefill time ``prefill_ms`` (ours:
``X-Engine-Prefill-Ms``; llama.cpp: ``timings.prompt_ms``; vLLM, SGLang and hosted APIs report
none, and a TTFT the proxy timed mixes queueing and the network in: there the holdout below is
the only measure, DESIGN.md's "no invented numbers"). Estimator: the slope ``b`` of the
least-squares line ``prefill_ms = a + b x uncached`` over the samples (``method = "slope"``:
the fixed per-request cost ``a`` — scheduling, the first decode step — is not a per-token cost,
so it is not counted as saved), when there are at least :data:`MIN_FIT` samples with two
distinct token counts and the slope is positive and at most the ratio below (a steeper slope
puts the line's fixed cost below zero, which no engine has: it is noise, such as a contended CPU
over a narrow range of prompt lengths — issue 37's loop measured a slope 4x the ratio and put
163 s of prefill on 50 s of TTFT); else the ratio ``sum(prefill_ms) / sum(uncached)``
(``method = "ratio"``: counts the fixed cost as per-token, an upper bound). No
sample: no rate (None, "not reported"). Linear in tokens: attention's growth with context
length is ignored (it makes long-prefix hits worth more than this says).

**Saved.** ``prefill_s_saved = rate x sum(cached - cf_cached) / 1000`` over the group's rows
with a counterfactual (what rewriting and our engine's span reuse made reusable beyond what the
client's own bodies would have got from a prefix cache: the same token figure as
``saved_tokens``' reuse part, issue 33; negative when rewriting cost hits).
``prefill_s_cached = rate x sum(cached) / 1000``: what the prefix cache saved in all, rewritten
or not. ``prefill_usd_saved = prefill_s_saved x usd_per_hour / 3600`` for a backend
with a policy ``usd_per_hour``.

**Holdout.** Where the policy's holdout sent sessions unrewritten, ``ttft_s_saved_holdout`` =
sum over prompt-length buckets (:data:`prefixgate.cache.savings.holdout_stats.BUCKETS`) with at least
:data:`prefixgate.cache.savings.holdout_stats.MIN_PER_ARM` TTFTs in each arm of ``n_rewritten x (mean
holdout TTFT - mean rewritten TTFT)`` / 1000: measured, not modelled; None otherwise.

Units: seconds (``*_s_*``), ms per token (``ms_per_token``), USD.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixgate.cache.savings.holdout_stats import BUCKETS, MIN_PER_ARM

MIN_UNCACHED = 16
"""Fewest uncached tokens a sample needs: below it the fixed per-request cost swamps the rate."""
MIN_FIT = 3
"""Fewest samples (with two distinct token counts) for the least-squares slope."""

Row = Mapping[str, Any]


@dataclass(frozen=True)
class PrefillRate:
    """ms of prefill per uncached prompt token; ``method``: ``slope`` | ``ratio``;
    ``samples``: rows it was estimated from."""

    ms_per_token: float
    method: str
    samples: int


def _ok(r: Row) -> bool:
    return (r.get("status") or "ok") == "ok"


def _samples(rows: Iterable[Row]) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        p, c, ms = r.get("prompt_tokens"), r.get("cached_tokens"), r.get("prefill_ms")
        if _ok(r) and p is not None and c is not None and ms is not None and p - c >= MIN_UNCACHED:
            out.append((float(p - c), float(ms)))
    return out


def fit_rate(samples: Sequence[tuple[float, float]]) -> tuple[float, str] | None:
    """``(ms per token, method)`` from ``(uncached tokens, ms)`` samples (module docstring)."""
    if not samples:
        return None
    n = len(samples)
    ratio = sum(y for _, y in samples) / sum(x for x, _ in samples)
    if n >= MIN_FIT and len({x for x, _ in samples}) >= 2:
        mx = sum(x for x, _ in samples) / n
        my = sum(y for _, y in samples) / n
        sxx = sum((x - mx) ** 2 for x, _ in samples)
        slope = sum((x - mx) * (y - my) for x, y in samples) / sxx
        if 0 < slope <= ratio:
            return slope, "slope"
    return ratio, "ratio"


def prefill_rate(rows: Sequence[Row]) -> PrefillRate | None:
    """The group's rate from the engine's own prefill times (module docstring)."""
    samples = _samples(rows)
    fit = fit_rate(samples)
    return None if fit is None else PrefillRate(fit[0], fit[1], len(samples))


def _key(r: Row) -> tuple[str, str]:
    return r.get("route") or "-", r.get("backend") or "-"


def rates(rows: Iterable[Row]) -> dict[tuple[str, str], PrefillRate | None]:
    """``{(route, backend): rate or None}`` over ``rows``."""
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        by[_key(r)].append(r)
    return {k: prefill_rate(rs) for k, rs in by.items()}


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(v, nd)


def holdout_ttft_saved_s(rows: Iterable[Row]) -> float | None:
    """``ttft_s_saved_holdout`` (module docstring)."""
    arms: dict[str, tuple[list[float], list[float]]] = {b: ([], []) for b, _, _ in BUCKETS}
    for r in rows:
        p, t = r.get("prompt_tokens"), r.get("ttft_ms")
        if not _ok(r) or p is None or t is None:
            continue
        bucket = next(b for b, lo, hi in BUCKETS if lo <= p < hi)
        arms[bucket][1 if r.get("holdout") else 0].append(float(t))
    total, any_bucket = 0.0, False
    for rw, ho in arms.values():
        if len(rw) >= MIN_PER_ARM and len(ho) >= MIN_PER_ARM:
            any_bucket = True
            total += len(rw) * (sum(ho) / len(ho) - sum(rw) / len(rw)) / 1000
    return total if any_bucket else None


def time_saved(rows: Sequence[Row], usd_per_hour: Mapping[str, float | None] | None = None,
               known: Mapping[tuple[str, str], PrefillRate | None] | None = None) -> dict[str, Any]:
    """The time figures of ``rows``: ``{"prefill_s_saved", "prefill_s_cached",
    "prefill_usd_saved", "ttft_s_saved_holdout", "rows_with_rate"}``; None = not measurable
    (no rate for any row's route; for ``prefill_s_saved`` also no counterfactual; for the USD no
    ``usd_per_hour``). ``known``: rates already estimated (e.g. over a wider set of
    rows than this group); ``usd_per_hour``: backend name -> the policy's price."""
    group_rates = known if known is not None else rates(rows)
    saved = cached = usd = 0.0
    timed = compared = priced = 0
    for r in rows:
        rate = group_rates.get(_key(r))
        c = r.get("cached_tokens")
        if rate is None or c is None or not _ok(r):
            continue
        timed += 1
        cached += c * rate.ms_per_token / 1000
        if r.get("cf_cached_tokens") is not None:
            s = (c - r["cf_cached_tokens"]) * rate.ms_per_token / 1000
            saved += s
            compared += 1
            hourly = (usd_per_hour or {}).get(r.get("backend") or "")
            if hourly is not None:
                usd += s * hourly / 3600
                priced += 1
    return {"prefill_s_saved": _r(saved) if compared else None,
            "prefill_s_cached": _r(cached) if timed else None,
            "prefill_usd_saved": _r(usd, 8) if priced else None,
            "ttft_s_saved_holdout": _r(holdout_ttft_saved_s(rows)),
            "rows_with_rate": timed}


def rate_fields(rate: PrefillRate | None) -> dict[str, Any]:
    """A route row's rate fields: ``prefill_ms_per_token``, ``prefill_rate_method``,
    ``prefill_rate_samples`` (None / 0 without a rate)."""
    if rate is None:
        return {"prefill_ms_per_token": None, "prefill_rate_method": None,
                "prefill_rate_samples": 0}
    return {"prefill_ms_per_token": _r(rate.ms_per_token, 6), "prefill_rate_method": rate.method,
            "prefill_rate_samples": rate.samples}
