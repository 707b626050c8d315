"""Savings by technique (issue 9, item 3): which rewrite pass saved what, in tokens and USD.

Input per request: the ledger's ``pass_tokens`` JSON (written by the proxy from the applied
Edits, never prompt text)::

    {"hoist_volatile": {"reusable": 1200, "removed": 0, "added": 40}, "prune_rag": {...}}

``reusable``: prompt tokens the pass made reusable from the prefix cache (the pass's own
estimate); ``removed``: tokens a pruning pass took out; ``added``: tokens a pass put in.

Dollars (:func:`attribute_usd`), from the request's measured prompt cost ``input_usd`` (the
backend's usage priced with :mod:`prefixgate.config.prices`, cache writes at their premium) and its
counterfactual ``cf_input_usd`` (the client's own body, same table):

- the whole saving is ``cf_input_usd - input_usd``: cache-write premiums and the price of the
  tokens passes added are already inside ``input_usd``, so they are subtracted by construction;
- a pruning pass is credited ``removed`` tokens at the counterfactual's blended price per
  prompt token (``cf_input_usd / (prompt_tokens + all removed)``): what those tokens would have
  cost as sent by the client;
- the rest is split among the passes that made tokens reusable, in proportion to ``reusable``;
  what no pass claims (no cache pass applied, a counterfactual's estimation error) is listed as
  :data:`UNATTRIBUTED`, never spread silently.

A request without usage (``prompt_tokens`` NULL) or without a counterfactual price gets no USD
(None), which is not a saving of 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

UNATTRIBUTED = "unattributed"


@dataclass
class TechniqueFigures:
    """Totals of one technique: tokens (ints) and ``usd`` (None until a priced row adds to
    it)."""

    technique: str
    tokens_reusable: int = 0
    tokens_removed: int = 0
    tokens_added: int = 0
    usd: float | None = None

    def add_usd(self, v: float) -> None:
        """Add ``v`` USD (turns None into a number)."""
        self.usd = (self.usd or 0.0) + v

    def to_dict(self) -> dict[str, Any]:
        """The ``by_technique`` entry of ``/api/savings``."""
        return {"technique": self.technique, "tokens_reusable": self.tokens_reusable,
                "tokens_removed": self.tokens_removed, "tokens_added": self.tokens_added,
                "usd": None if self.usd is None else round(self.usd, 8)}


def parse_pass_tokens(text: str | None) -> dict[str, dict[str, int]]:
    """The ``pass_tokens`` column as ``{pass: {"reusable", "removed", "added"}}``; empty for
    NULL, "" or anything unreadable (never raises)."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    out: dict[str, dict[str, int]] = {}
    if not isinstance(obj, dict):
        return out
    for name, figs in obj.items():
        if isinstance(figs, dict):
            out[str(name)] = {k: int(figs.get(k) or 0) for k in ("reusable", "removed", "added")}
    return out


def attribute_usd(passes: Mapping[str, Mapping[str, int]], prompt_tokens: int | None,
                  input_usd: float | None, cf_input_usd: float | None) -> dict[str, float] | None:
    """USD saved per technique for one request (module docstring); None when the request has
    no usage or no priced counterfactual. Values sum to ``cf_input_usd - input_usd``."""
    if prompt_tokens is None or input_usd is None or cf_input_usd is None:
        return None
    total = cf_input_usd - input_usd
    removed_all = sum(f.get("removed", 0) for f in passes.values())
    original = prompt_tokens + removed_all
    rate = cf_input_usd / original if original > 0 else 0.0
    out: dict[str, float] = {}
    for name, f in passes.items():
        if f.get("removed", 0) > 0:
            out[name] = f["removed"] * rate
    rest = total - sum(out.values())
    claims = {n: f.get("reusable", 0) for n, f in passes.items() if f.get("reusable", 0) > 0}
    claimed = sum(claims.values())
    if claimed:
        for name, c in claims.items():
            out[name] = out.get(name, 0.0) + rest * c / claimed
    elif abs(rest) > 1e-12:
        out[UNATTRIBUTED] = rest
    return out


def by_technique(rows: Iterable[Mapping[str, Any]]) -> list[TechniqueFigures]:
    """Sum tokens and USD per technique over ledger rows (``pass_tokens``, ``prompt_tokens``,
    ``input_usd``, ``cf_input_usd``), sorted by USD saved then tokens, largest first."""
    acc: dict[str, TechniqueFigures] = {}
    for r in rows:
        passes = parse_pass_tokens(r.get("pass_tokens"))
        for name, f in passes.items():
            t = acc.setdefault(name, TechniqueFigures(name))
            t.tokens_reusable += f["reusable"]
            t.tokens_removed += f["removed"]
            t.tokens_added += f["added"]
        usd = attribute_usd(passes, r.get("prompt_tokens"), r.get("input_usd"),
                            r.get("cf_input_usd"))
        for name, v in (usd or {}).items():
            acc.setdefault(name, TechniqueFigures(name)).add_usd(v)
    return sorted(acc.values(), key=lambda t: (-(t.usd or 0.0), -t.tokens_reusable,
                                              -t.tokens_removed, t.technique))


def merge_techniques(parts: Iterable[Mapping[str, Mapping[str, Any]]]) -> list[TechniqueFigures]:
    """Sum per-minute rollup technique maps ``{name: {"reusable", "removed", "added", "usd"}}``
    (``usd`` None = no priced row) into sorted :class:`TechniqueFigures`."""
    acc: dict[str, TechniqueFigures] = {}
    for part in parts:
        for name, f in part.items():
            t = acc.setdefault(name, TechniqueFigures(name))
            t.tokens_reusable += int(f.get("reusable") or 0)
            t.tokens_removed += int(f.get("removed") or 0)
            t.tokens_added += int(f.get("added") or 0)
            if f.get("usd") is not None:
                t.add_usd(float(f["usd"]))
    return sorted(acc.values(), key=lambda t: (-(t.usd or 0.0), -t.tokens_reusable,
                                              -t.tokens_removed, t.technique))
