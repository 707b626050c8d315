"""One vocabulary for why a prefix cache missed: the providers' own reasons and prefixgate's
predicted cause (issue 35, item 3).

Reported (what the ledger's ``reported_miss`` column holds, as the provider wrote it):

* Anthropic cache diagnostics (beta ``cache-diagnosis-2026-04-07``, request
  ``diagnostics.previous_message_id``; https://platform.claude.com/docs/en/build-with-claude/cache-diagnostics
  and the SDKs' ``CacheMiss*`` models, read 2026-12-06): ``diagnostics.cache_miss_reason.type``
  in ``model_changed | system_changed | tools_changed | messages_changed |
  previous_message_not_found | unavailable``, with ``cache_missed_input_tokens``; a
  ``diagnostics`` object whose ``cache_miss_reason`` is null is a comparison still running:
  ``pending``.
* OpenAI Responses prompt cache diagnostics (GPT-5.6 and later; request
  ``prompt_cache_options.comparison_response_id``;
  https://developers.openai.com/api/docs/guides/prompt-caching/diagnostics and the SDKs'
  ``PromptCacheDiagnostics``, read 2026-12-06): ``prompt_cache_diagnostics.type`` ``cache_hit |
  cache_miss | comparison_response_not_found | unavailable``; a miss carries ``reason``
  (``cache_missed_tokens``, ``comparison_reusable_tokens``). The full list of reasons was not
  found in the docs read; the ones below are issue 35's, and any other reason is kept as written
  and counted as ``other``.

Predicted: a :class:`prefixgate.cache.savings.breaks.BreakRecord`'s ``kind`` and ``region``.

Causes: ``model``, ``tools``, ``system``, ``messages``, ``input`` (OpenAI's ``input_changed``: the
instructions or the conversation, so it agrees with a predicted ``system`` or ``messages``),
``settings`` (request fields the model reads but the prompt text does not show: key, format,
reasoning effort, verbosity, service tier — not visible to a text diff), ``compacted``,
``baseline_missing``, ``unavailable``, ``pending``, ``hit``, ``none`` (no break predicted),
``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

REPORTED: dict[str, str] = {
    "model_changed": "model", "system_changed": "system", "tools_changed": "tools",
    "messages_changed": "messages", "previous_message_not_found": "baseline_missing",
    "comparison_response_not_found": "baseline_missing", "unavailable": "unavailable",
    "pending": "pending", "cache_hit": "hit", "input_changed": "input",
    "context_compacted": "compacted", "prompt_cache_key_changed": "settings",
    "text_format_changed": "settings", "reasoning_effort_changed": "settings",
    "verbosity_changed": "settings", "service_tier_changed": "settings",
}
"""Provider reason -> cause (module docstring)."""
NOT_A_MISS = frozenset({"pending", "hit", "unavailable", "baseline_missing"})
"""Reported causes that say nothing about a divergence: left out of the agreement figure."""


def reported_cause(reason: str) -> str:
    """The cause of a provider's reason (``""`` -> ``""``: nothing reported)."""
    if not reason:
        return ""
    return REPORTED.get(reason, "other")


def predicted_cause(record: Mapping[str, Any] | None) -> str:
    """The cause of a break record (a :class:`~prefixgate.cache.savings.breaks.BreakRecord`
    dict): ``model`` for ``model_changed``, else its region (``tools`` / ``system`` /
    ``messages``); ``none`` without a record."""
    if not record:
        return "none"
    if record.get("kind") == "model_changed":
        return "model"
    region = str(record.get("region", ""))
    return region if region in ("tools", "system", "messages") else "other"


def agrees(predicted: str, reported: str) -> bool:
    """Whether prefixgate's predicted cause names the reported one (``input`` covers
    ``system`` and ``messages``; ``compacted`` is a ``messages`` change)."""
    if reported == "input":
        return predicted in ("system", "messages")
    if reported == "compacted":
        return predicted == "messages"
    return predicted == reported


def agreement(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Per reported cause, over ``(predicted cause, reported cause)`` pairs of reported misses:
    ``{"misses", "agree", "share", "predicted": {cause: n}}``, causes in :data:`NOT_A_MISS`
    left out; ``share`` None without misses."""
    out: dict[str, dict[str, Any]] = {}
    for pred, rep in pairs:
        if not rep or rep in NOT_A_MISS:
            continue
        e = out.setdefault(rep, {"misses": 0, "agree": 0, "share": None, "predicted": {}})
        e["misses"] += 1
        e["agree"] += agrees(pred, rep)
        e["predicted"][pred] = e["predicted"].get(pred, 0) + 1
    for e in out.values():
        e["share"] = round(e["agree"] / e["misses"], 4) if e["misses"] else None
    return dict(sorted(out.items()))


def reported_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``/api/savings`` and ``prefixgate report --breaks`` show over ledger ``rows``
    (``reported_miss``, ``reported_missed_tokens``, ``predicted_miss``): ``{"reported": {reason:
    n}, "missed_tokens": sum, "agreement": agreement(...)}``."""
    counts: dict[str, int] = {}
    missed = 0
    pairs = []
    for r in rows:
        reason = r.get("reported_miss") or ""
        if not reason:
            continue
        counts[reason] = counts.get(reason, 0) + 1
        missed += int(r.get("reported_missed_tokens") or 0)
        pairs.append((r.get("predicted_miss") or "none", reported_cause(reason)))
    return {"reported": dict(sorted(counts.items())), "missed_tokens": missed,
            "agreement": agreement(pairs)}


def format_predicted_vs_reported(rows: Iterable[Mapping[str, Any]]) -> str:
    """Text of ``prefixgate report --breaks``' second part: each request the provider reported
    on (ledger ``rows``), prefixgate's predicted cause vs the provider's reason as written and
    its cause, then the agreement per reported cause. At most 80 columns."""
    head = f"{'session':<10} {'predicted':<10} {'reported':<28} {'cause':<12} {'missed':>8} agree"
    lines = [head]
    kept = []
    for r in rows:
        reason = str(r.get("reported_miss") or "")
        if not reason:
            continue
        kept.append(r)
        pred, rep = str(r.get("predicted_miss") or "none"), reported_cause(reason)
        ok = "-" if rep in NOT_A_MISS else ("yes" if agrees(pred, rep) else "no")
        missed = r.get("reported_missed_tokens")
        lines.append(f"{str(r.get('session', ''))[:10]:<10} {pred[:10]:<10} {reason[:28]:<28} "
                     f"{rep:<12} {'-' if missed is None else missed:>8} {ok}")
    if not kept:
        return "no provider-reported cache diagnostics"
    for cause, e in reported_summary(kept)["agreement"].items():
        lines.append(f"predicted = reported, {cause}: {e['agree']}/{e['misses']}")
    return "\n".join(lines)
