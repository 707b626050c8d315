"""Human text for the figures the ``prefixgate`` commands print."""

from __future__ import annotations

from typing import Any


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
