"""Savings by technique (issue 9 item 3, issue 19 item 5): which pass saved what, in tokens and
USD, with parts that add up to the total.

Input per request: the ledger's ``pass_tokens`` JSON (written by the proxy, never prompt text)::

    {"hoist_volatile": {"reusable": 1200, "removed": 0, "added": 40}, "prune_rag": {...}}

- ``reusable``: prompt tokens the pass made reusable that would not have been reusable without
  it — its credit by the stage-chain rule of :mod:`prefixgate.proxy.observe.insight` (the cached
  tokens of a cache fed every request's body after passes 1..k, minus those of one fed the
  bodies after passes 1..k-1; signed: a pass that broke a prefix is charged). A pass that never
  changed the bytes the backend sees is credited 0, and so is every pass of a request whose
  rewritten prompt the backend saw as the client's own.
- ``removed``: tokens a pruning pass took out; ``added``: tokens a pass put in (a note).

Per request, the parts and the whole (:func:`row_techniques`)::

    saved tokens  = (cached - cf_cached) + removed - added      (the request's whole saving)
    per pass      = reusable + removed - added
    span reuse    = span_reused                                 (the engine's own count)
    unattributed  = (cached - cf_cached) - sum(reusable) - span_reused   (named, never spread)

:data:`SPAN_REUSE` (issue 33) is measured, never modelled: our engine's count of the cached
tokens it reused across a changed span (a clock, an id) after its prefix match stopped (the
ledger's ``span_reused_tokens``). The counterfactual is the client's body on a prefix cache —
what the cache models compute, and what a row measured as sent gets as ``cached -
span_reused`` (:mod:`prefixgate.cache.savings.counterfactual`) — so those tokens are inside
``cached - cf_cached`` and are taken out of the remainder, not added to the whole. Counted where
the rest is: on rows with usage and a counterfactual.

so the per-technique figures, :data:`UNATTRIBUTED` included, sum to the total exactly. The
remainder is what the backend's measured cached tokens differ from the stage models by: the
model's error on the rewritten arm (chat-template tokens, the engine's own eviction), and the
difference between the token-id counterfactual and the block models of the stages. ``cached -
cf_cached`` counts only where the request has a counterfactual (as the totals do); ``removed``
and ``added`` count on every request whose usage the backend reported (:func:`answered`): one
that failed upstream, or was refused or cut before any usage came, was billed nothing we can
show, so its pruning saved nothing (and a client's retry is not a second saving). ``saved`` is
tokens no longer billed at the full input price: ``(cf_prompt - cf_cached) - (prompt -
cached)`` with ``cf_prompt = prompt + removed - added``.

Dollars, where the request is priced both ways (``input_usd`` and ``cf_input_usd``, the
backend's usage and the counterfactual priced with :mod:`prefixgate.config.prices`): the whole
saving is ``cf_input_usd - input_usd`` (cache-write premiums and the price of added tokens are
inside ``input_usd``); a pass gets ``reusable x (input - cached_input) + removed x cf rate -
added x input`` (list prices of the request's model per token; ``cf rate`` = ``cf_input_usd /
cf_prompt``, what a pruned token would have cost as the client sent it), and what is left
(write premiums, the model's error) is :data:`UNATTRIBUTED`. A request without usage or a
counterfactual price gets no USD (None), which is not a saving of 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefixgate.config.prices import price_for

UNATTRIBUTED = "unattributed"
SPAN_REUSE = "span reuse (engine)"
"""The technique of the engine's reuse across a changed span (issue 33; module docstring)."""
FIELDS = ("reusable", "removed", "added")


@dataclass
class TechniqueFigures:
    """Totals of one technique: tokens (ints) and ``usd`` (None until a priced row adds to
    it)."""

    technique: str
    tokens_reusable: int = 0
    tokens_removed: int = 0
    tokens_added: int = 0
    usd: float | None = None

    @property
    def saved_tokens(self) -> int:
        """``reusable + removed - added``: this technique's share of the total saved tokens."""
        return self.tokens_reusable + self.tokens_removed - self.tokens_added

    def add_usd(self, v: float) -> None:
        """Add ``v`` USD (turns None into a number)."""
        self.usd = (self.usd or 0.0) + v

    def to_dict(self) -> dict[str, Any]:
        """The ``by_technique`` entry of ``/api/savings`` and ``prefixgate report --json``."""
        return {"technique": self.technique, "tokens_reusable": self.tokens_reusable,
                "tokens_removed": self.tokens_removed, "tokens_added": self.tokens_added,
                "saved_tokens": self.saved_tokens,
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
            try:
                out[str(name)] = {k: int(figs.get(k) or 0) for k in FIELDS}
            except (TypeError, ValueError):
                continue
    return out


def answered(row: Mapping[str, Any]) -> bool:
    """True when the backend reported the request's usage (``prompt_tokens`` known): the
    requests a saving is counted on (module docstring)."""
    return row.get("prompt_tokens") is not None


def reuse_of(row: Mapping[str, Any]) -> int:
    """``cached - cf_cached`` of a row with usage and a counterfactual, else 0 (the totals'
    rule, :mod:`prefixgate.cache.savings.summary` and :mod:`prefixgate.cache.savings.report`)."""
    if row.get("prompt_tokens") is None or row.get("cf_cached_tokens") is None:
        return 0
    return int(row.get("cached_tokens") or 0) - int(row["cf_cached_tokens"])


def span_reused_of(row: Mapping[str, Any]) -> int:
    """The engine's span-reused tokens of a row counted as a saving (module docstring): its
    ``span_reused_tokens`` where the row has usage and a counterfactual, else 0."""
    if row.get("prompt_tokens") is None or row.get("cf_cached_tokens") is None:
        return 0
    return max(0, int(row.get("span_reused_tokens") or 0))


def attribute_usd(passes: Mapping[str, Mapping[str, int]], row: Mapping[str, Any],
                  ) -> dict[str, float] | None:
    """USD saved per technique for one request (module docstring), :data:`UNATTRIBUTED`
    holding the rest (absent when 0); None when the request is not priced both ways. Values
    sum to ``cf_input_usd - input_usd``."""
    prompt, inp, cf = row.get("prompt_tokens"), row.get("input_usd"), row.get("cf_input_usd")
    if prompt is None or inp is None or cf is None:
        return None
    total = float(cf) - float(inp)
    price = price_for(str(row.get("model") or ""))
    out: dict[str, float] = {}
    if price is not None:
        removed = sum(f.get("removed", 0) for f in passes.values())
        added = sum(f.get("added", 0) for f in passes.values())
        cf_prompt = int(prompt) + removed - added
        rate = float(cf) / cf_prompt if cf_prompt > 0 else 0.0
        for name, f in passes.items():
            v = (f.get("reusable", 0) * (price.input - price.cached_input) / 1e6
                 + f.get("removed", 0) * rate - f.get("added", 0) * price.input / 1e6)
            if v:
                out[name] = v
    rest = total - sum(out.values())
    if abs(rest) > 1e-12:
        out[UNATTRIBUTED] = rest
    return out


def row_techniques(row: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One ledger row's ``{technique: {"reusable", "removed", "added", "usd"}}`` with the
    :data:`UNATTRIBUTED` remainder (module docstring): the parts of the row's whole saving.
    ``usd`` None where the row is not priced; empty for a row without usage (:func:`answered`)."""
    if not answered(row):
        return {}
    passes = parse_pass_tokens(row.get("pass_tokens"))
    span = span_reused_of(row)
    if span:
        passes[SPAN_REUSE] = {"reusable": span, "removed": 0, "added": 0}
    rest = reuse_of(row) - sum(f["reusable"] for f in passes.values())
    out: dict[str, dict[str, Any]] = {n: {**f, "usd": None} for n, f in passes.items()}
    if rest:
        out[UNATTRIBUTED] = {"reusable": rest, "removed": 0, "added": 0, "usd": None}
    for name, v in (attribute_usd(passes, row) or {}).items():
        out.setdefault(name, {"reusable": 0, "removed": 0, "added": 0, "usd": None})["usd"] = v
    return out


def _sorted(acc: dict[str, TechniqueFigures]) -> list[TechniqueFigures]:
    """Passes by USD saved then tokens, largest first; :data:`UNATTRIBUTED` last."""
    return sorted(acc.values(), key=lambda t: (t.technique == UNATTRIBUTED, -(t.usd or 0.0),
                                              -t.saved_tokens, t.technique))


def by_technique(rows: Iterable[Mapping[str, Any]]) -> list[TechniqueFigures]:
    """Sum :func:`row_techniques` over ledger rows (``pass_tokens``, ``prompt_tokens``,
    ``cached_tokens``, ``cf_cached_tokens``, ``input_usd``, ``cf_input_usd``, ``model``)."""
    return merge_techniques(row_techniques(r) for r in rows)


def merge_techniques(parts: Iterable[Mapping[str, Mapping[str, Any]]]) -> list[TechniqueFigures]:
    """Sum technique maps ``{name: {"reusable", "removed", "added", "usd"}}`` (per row, or per
    minute from the rollups; ``usd`` None = no priced row) into sorted
    :class:`TechniqueFigures`."""
    acc: dict[str, TechniqueFigures] = {}
    for part in parts:
        for name, f in part.items():
            t = acc.setdefault(name, TechniqueFigures(name))
            t.tokens_reusable += int(f.get("reusable") or 0)
            t.tokens_removed += int(f.get("removed") or 0)
            t.tokens_added += int(f.get("added") or 0)
            if f.get("usd") is not None:
                t.add_usd(float(f["usd"]))
    return _sorted(acc)


def added_tokens(rows: Iterable[Mapping[str, Any]]) -> int:
    """Tokens the passes added over the ``rows`` with usage (``pass_tokens`` ``added``,
    :func:`answered`)."""
    return sum(f["added"] for r in rows if answered(r)
               for f in parse_pass_tokens(r.get("pass_tokens")).values())
