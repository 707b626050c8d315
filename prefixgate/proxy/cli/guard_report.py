"""``prefixgate report --guard``: the meaning guard's standing per route, tenant and move, and
what its trials cost (issue 36).

Read from the ledger alone, so it works from any host and for a fleet's shared ledger: each
trial send's row (``trial`` = the move) carries in ``edits`` the move's verdict after that
trial's pair (:func:`prefixgate.proxy.pipeline.guard_trial.verdict_json`: state, pairs, the
move's and the floor's changed-answer rates, when it expires); the latest one per (route,
tenant, move) is the standing. Per route: today's (UTC) trial spend against the day's budget
(:func:`prefixgate.proxy.pipeline.guard_trial.route_budget`, from ``--policy``). A hosted route
with no trial budget gets none, so the report says what is at stake instead: what
``hoist_volatile`` would save there (the cache breaks its fix names, with their cost,
:func:`prefixgate.cache.savings.top_break.explain_breaks`) and what one trial would cost at the
dated price table (three sends of the route's mean prompt plus the guard's ``max_tokens``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.savings.top_break import HOIST_FIX, explain_breaks
from prefixgate.cache.savings.trial_cost import trial_spend
from prefixgate.config.schema import Policy
from prefixgate.proxy.pipeline.guard_trial import SENDS, TOKEN_SLACK, route_budget, trial_usd

VERDICT_COLUMNS = ("ts", "trial", "route", "tenant", "edits")


def utc_midnight(now: float) -> float:
    """Unix seconds of the UTC day's start of ``now`` (the budgets' day)."""
    return now - now % 86400


def latest_verdicts(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The latest verdict per (route, tenant, move) among trial rows (``trial``, ``route``,
    ``tenant``, ``edits``; oldest first), sorted; rows without one (a failed send) skipped."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        try:
            v = json.loads(r.get("edits") or "")
        except ValueError:
            continue
        if isinstance(v, dict) and "state" in v:
            key = (str(r.get("route") or ""), str(r.get("tenant") or ""), str(r["trial"]))
            latest[key] = {"route": key[0], "tenant": key[1], "move": key[2], **v}
    return [latest[k] for k in sorted(latest)]


def _trial_rows(db: Ledger, since_ts: float) -> list[dict[str, Any]]:
    got = db.query(f"SELECT {', '.join(VERDICT_COLUMNS)}, model, prompt_tokens, output_tokens, "
                   "input_usd FROM requests WHERE ts >= ? AND COALESCE(trial, '') != '' "
                   "ORDER BY id", (since_ts,))
    cols = (*VERDICT_COLUMNS, "model", "prompt_tokens", "output_tokens", "input_usd")
    return [dict(zip(cols, r)) for r in got]


def route_figures(policy: Policy, route: str, client: Sequence[Mapping[str, Any]],
                  spent: Mapping[str, Any], breaks: Sequence[Mapping[str, Any]]
                  ) -> dict[str, Any]:
    """One route's line: its backend, today's budget and spend; for a route whose budget allows
    no trial, what hoisting would save (breaks whose fix is :data:`HOIST_FIX`) and what one
    trial would cost at the price table (None where unpriced)."""
    backend_name = next((str(r.get("backend") or "") for r in reversed(client)), "")
    backend = policy.backends.get(backend_name)
    model = next((str(r.get("model") or "") for r in reversed(client)), "")
    out: dict[str, Any] = {"route": route, "backend": backend_name, "budget": None,
                           "spent_today": {k: spent.get(k, 0) for k in ("requests", "tokens",
                                                                         "usd")}}
    if backend is None:
        return out
    budget = route_budget(policy.meaning_guard, policy, route, backend, model)
    out["budget"] = budget.model_dump()
    if budget.requests_per_day > 0:
        return out
    prompts = [int(r["prompt_tokens"]) for r in client if r.get("prompt_tokens") is not None]
    mean = sum(prompts) / len(prompts) if prompts else 0.0
    cap = policy.meaning_guard.max_tokens
    priced, usd = trial_usd(backend, model, int(SENDS * (mean + TOKEN_SLACK)), SENDS * cap)
    hoist = [e for e in explain_breaks(breaks, client, limit=100) if e.get("fix") == HOIST_FIX]
    out["no_budget"] = {
        "trial_usd": round(usd, 6) if priced else None,
        "hoist_tokens_lost": sum(int(e.get("tokens_lost") or 0) for e in hoist),
        "hoist_usd_lost": (round(sum(float(e["usd_lost"]) for e in hoist), 6)
                           if hoist and all(e.get("usd_lost") is not None for e in hoist)
                           else None)}
    return out


def guard_figures(db: Ledger, policy: Policy, since_ts: float = 0.0,
                  now: float | None = None) -> dict[str, Any]:
    """``{"verdicts": [...], "routes": [...], "trials": spend}`` (module docstring); ``trials``:
    every trial send since ``since_ts`` (:func:`prefixgate.cache.savings.trial_cost.trial_spend`)."""
    now = time.time() if now is None else now
    trials = _trial_rows(db, since_ts)
    today = trial_spend(r for r in trials if float(r["ts"]) >= utc_midnight(now))
    client = db.rows(since_ts)
    breaks = db.breaks(since_ts)
    routes = sorted({str(r.get("route") or "") for r in client} | set(today["by_route"]))
    lines = [route_figures(policy, route, [r for r in client if r.get("route") == route],
                           today["by_route"].get(route, {}),
                           [b for b in breaks if b.get("route") == route])
             for route in routes if route]
    spend = trial_spend(trials)
    spend.pop("by_route")
    return {"verdicts": latest_verdicts(trials), "routes": lines, "trials": spend}


def _rate(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def _when(ts: Any) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(ts)))


def guard_lines(fig: Mapping[str, Any]) -> list[str]:
    """The report's text: one line per verdict, one per route (spend vs budget, or what is at
    stake without one)."""
    out = ["meaning guard: route | tenant | move | state | pairs | move vs floor | expires"]
    for v in fig["verdicts"]:
        out.append(f"  {v['route']} | {v['tenant'] or '-'} | {v['move']} | {v['state']} | "
                   f"{v['pairs']} | {_rate(v.get('move_rate'))} vs {_rate(v.get('floor_rate'))}"
                   f" | {_when(v.get('expires_at'))}")
    if not fig["verdicts"]:
        out.append("  no trial has given a verdict yet")
    out.append("today's trials by route: spent / budget (requests, tokens, $)")
    for r in fig["routes"]:
        s, b = r["spent_today"], r["budget"]
        if b is None:
            out.append(f"  {r['route']}: {s['requests']} requests, {s['tokens']} tokens, "
                       f"${s['usd']:.4f} (budget unknown: pass --policy)")
            continue
        out.append(f"  {r['route']}: {s['requests']}/{b['requests_per_day']} requests, "
                   f"{s['tokens']}/{b['tokens_per_day']} tokens, ${s['usd']:.4f}/"
                   f"${b['usd_per_day']:.4f}")
        nb = r.get("no_budget")
        if nb is not None:
            usd = "unpriced" if nb["trial_usd"] is None else f"${nb['trial_usd']:.4f}"
            lost = ("" if nb["hoist_usd_lost"] is None else f", ${nb['hoist_usd_lost']:.4f}")
            out.append(f"    no trial budget: hoist_volatile would save about "
                       f"{nb['hoist_tokens_lost']} prompt tokens{lost} (cache breaks it fixes); "
                       f"one trial (3 sends) would cost {usd} at the price table "
                       f"(set routes[].meaning_guard_budget or meaning_guard.hosted_budget)")
    return out
