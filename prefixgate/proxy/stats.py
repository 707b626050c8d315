"""Small summaries shared by ``prefixgate report`` and ``prefixgate replay``.

:func:`percentile` is the nearest-rank-with-interpolation percentile (numpy's default "linear"
method); :func:`summarize` turns per-request records into the figures both commands print.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def percentile(values: Iterable[float], p: float) -> float | None:
    """``p``-th percentile (0-100) with linear interpolation; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures of a set of request records (ledger rows or replay results).

    Each record may carry ``status``, ``prompt_tokens``, ``cached_tokens``, ``ttft_ms``,
    ``tpot_ms``, ``tokens_pruned``. Returns ``{"requests", "errors", "prompt_tokens",
    "cached_tokens", "cached_share" (0-1 over requests reporting both), "ttft_p50_ms",
    "ttft_p95_ms", "tpot_p50_ms", "tokens_pruned"}``.
    """
    rs = list(records)
    with_usage = [r for r in rs if r.get("prompt_tokens") is not None
                  and r.get("cached_tokens") is not None]
    prompt = sum(r.get("prompt_tokens") or 0 for r in rs)
    p_known = sum(r["prompt_tokens"] for r in with_usage)
    cached = sum(r["cached_tokens"] for r in with_usage)
    ttft = [r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in rs if r.get("tpot_ms") is not None]
    return {
        "requests": len(rs),
        "errors": sum(1 for r in rs if r.get("status", "ok") != "ok"),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": (cached / p_known) if p_known else None,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        "tpot_p50_ms": percentile(tpot, 50),
        "tokens_pruned": sum(r.get("tokens_pruned") or 0 for r in rs),
    }


def fmt(v: Any, kind: str = "") -> str:
    """Human text for a figure: ``ms`` -> "12.3", ``share`` -> "87%", ``usd`` -> "0.0123",
    None -> ``-``."""
    if v is None:
        return "-"
    if kind == "share":
        return f"{100 * v:.0f}%"
    if kind == "ms":
        return f"{v:.1f}"
    if kind == "usd":
        return f"{v:.4f}"
    return f"{v:,}" if isinstance(v, int) else str(v)
