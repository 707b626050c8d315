"""P/D split decisions as the ledger records them, counted for the report and the dashboard.

The proxy writes each P/D backend's decision into the row's ``deployment``
(``proxy/pipeline/send.py``): ``<backend>/pd-split:<reason>`` or
``<backend>/pd-colocate:<reason>`` (reasons: ``split``, ``short_uncached``, ``prefix_hit``,
``prefill_failed``; ``proxy/routing/pd/split.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["pd_decision", "pd_summary"]


def pd_decision(deployment: str | None) -> tuple[str, str] | None:
    """``(decision, reason)`` of a row's ``deployment`` (``("split", "split")``,
    ``("colocate", "prefix_hit")``...), None for a row no P/D backend answered."""
    _, sep, tail = (deployment or "").rpartition("/pd-")
    if not sep:
        return None
    decision, _, reason = tail.partition(":")
    if decision not in ("split", "colocate"):
        return None
    return decision, reason or "-"


def pd_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``{"split", "colocate", "split_share", "reasons": {"<decision>:<reason>": n}}`` over the
    rows a P/D backend answered; None when none was."""
    got = Counter(d for r in rows if (d := pd_decision(r.get("deployment"))) is not None)
    if not got:
        return None
    split = sum(n for (d, _), n in got.items() if d == "split")
    total = sum(got.values())
    return {"split": split, "colocate": total - split, "split_share": round(split / total, 6),
            "reasons": {f"{d}:{r}": n for (d, r), n in sorted(got.items())}}
