"""The figures ``prefixgate report`` and ``prefixgate replay`` print (:mod:`prefixgate.proxy.cli.report`),
computed from ledger rows.

:func:`group_figures` summarizes rows per ``route`` / ``model`` / ``tenant`` (the ledger's
``tenant``, :mod:`prefixgate.proxy.http.tenants`; else the proxy key id a request authenticated with,
``-`` without either) / ``day`` (UTC date) / ``replica`` (the proxy process that served it,
issue 26: one shared ledger, every replica's rows); :func:`saved_figures`
is the opening "saved" line; :func:`stand_back_figures` the routes where passes stood back;
:func:`error_figures` the ``--errors`` table. Every figure is a
plain sum or percentile of ledger columns, so the report equals the ledger.

:func:`percentile` is the
linear-interpolation percentile (numpy's default method); :func:`summarize` turns per-request
records (ledger rows or replay results) into the figures both commands print.

Money: ``input_usd`` / ``cf_input_usd`` are summed over rows priced both ways (the request as
sent, and the client's own body); ``saved_usd`` is their difference, ``saved_pct`` its share of
``cf_input_usd``. Tokens: ``saved_tokens = (cached - cf_cached) + pruned - added`` (cache reuse
over rows with a counterfactual; pruned and added, the passes' tokens, over the rows whose usage
the backend reported: a request that failed or was cut before usage saved nothing), split by
technique in :mod:`prefixgate.cache.ledger.attribution` (the parts sum to it). TTFT: ``ttft_reported``
counts rows whose TTFT the backend reported (a non-streamed answer; ledger ``ttft_source =
reported``), the others were timed by the proxy. Time: ``prefill_s_saved``,
``prefill_s_cached``, ``prefill_usd_saved``, ``ttft_s_saved_holdout``
(:mod:`prefixgate.cache.savings.time_saved`), each group's rows priced at the prefill rate of their
(route, backend) estimated over all the report's rows.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixgate.cache.ledger.attribution import added_tokens, answered, reuse_of
from prefixgate.cache.savings.holdout_stats import holdout_report
from prefixgate.cache.savings.time_saved import PrefillRate, rates, time_saved


def percentile(values: Iterable[float], p: float) -> float | None:
    """``p``-th percentile (0-100) with linear interpolation; None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ttft_values(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """The one definition of the TTFT figures (issue 37, item 5: the report's headline said
    56.0 ms and its route row 50.4 for the same requests, the headline counting answered
    requests only): the ``ttft_ms`` of every record that has one, whatever its status — a
    stream cut after its first token did reach it. Every TTFT percentile of the report, the
    ``/api/savings`` totals, routes and replicas, is a percentile of these."""
    return [float(r["ttft_ms"]) for r in records if r.get("ttft_ms") is not None]


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
    ttft = ttft_values(rs)
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


BY = ("route", "model", "tenant", "day", "replica")
NO_ROUTE = "(no route matched)"
"""The route group of requests refused before routing (an unknown model's 404, a malformed
body's 400): their model names the typo; a bare ``-`` said nothing (issue 37, item 9)."""


def group_key(row: Mapping[str, Any], by: str) -> str:
    """The group of ``row`` for ``by`` (one of :data:`BY`)."""
    if by == "day":
        return time.strftime("%Y-%m-%d", time.gmtime(row.get("ts") or 0))
    if by == "tenant":  # the ledger's tenant (http.tenants); rows from before it: the key id
        return row.get("tenant") or row.get("key_id") or "-"
    if by == "route":
        return row.get("route") or NO_ROUTE
    return row.get(by) or "-"


def money(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``input_usd``, ``cf_input_usd``, ``saved_usd``, ``saved_pct``, ``priced`` (rows
    priced both ways); None figures when no row is."""
    priced = [r for r in rows if r.get("input_usd") is not None
              and r.get("cf_input_usd") is not None]
    if not priced:
        return {"priced": 0, "input_usd": None, "cf_input_usd": None, "saved_usd": None,
                "saved_pct": None}
    inp = sum(r["input_usd"] for r in priced)
    cf = sum(r["cf_input_usd"] for r in priced)
    return {"priced": len(priced), "input_usd": inp, "cf_input_usd": cf, "saved_usd": cf - inp,
            "saved_pct": (cf - inp) / cf if cf else None}


def token_savings(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``cf_cached_share``, ``saved_tokens`` and ``added_tokens`` (module docstring)."""
    cf = [r for r in rows if r.get("cf_cached_tokens") is not None
          and r.get("prompt_tokens") is not None]
    p = sum(r["prompt_tokens"] for r in cf)
    reuse = sum(reuse_of(r) for r in cf)
    added = added_tokens(rows)
    return {"cf_cached_share": (sum(r["cf_cached_tokens"] for r in cf) / p) if p else None,
            "saved_tokens": reuse + sum(r.get("tokens_pruned") or 0 for r in rows if answered(r))
            - added,
            "added_tokens": added}


Rates = Mapping[tuple[str, str], PrefillRate | None]


def figures(rows: Sequence[Mapping[str, Any]], known: Rates | None = None,
            usd_per_hour: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """Every figure of one group of rows (see module docstring)."""
    s = summarize(rows)
    s.update(money(rows))
    s.update(token_savings(rows))
    s.update(time_saved(rows, usd_per_hour, known))
    s["ttft_reported"] = sum(1 for r in rows if r.get("ttft_source") == "reported")
    s["no_usage"] = sum(1 for r in rows if r.get("prompt_tokens") is None)
    s["holdout"] = sum(1 for r in rows if r.get("holdout"))
    return s


def group_figures(rows: Iterable[Mapping[str, Any]], by: str,
                  usd_per_hour: Mapping[str, float | None] | None = None) -> list[dict[str, Any]]:
    """``[{by: key, **figures}]`` sorted by key. Raises ValueError for an unknown ``by``."""
    if by not in BY:
        raise ValueError(f"--by must be one of {', '.join(BY)}")
    rows = list(rows)
    known = rates(rows)
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[group_key(r, by)].append(r)
    return [{by: k, **figures(rs, known, usd_per_hour)} for k, rs in sorted(groups.items())]


def saved_figures(rows: Sequence[Mapping[str, Any]], seed: int = 0,
                  usd_per_hour: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """The "saved" line: money, tokens, prefill time, and TTFT p50 rewritten minus holdout (ms,
    negative = faster; None without holdout requests on both sides) with the holdout verdict."""
    out = {**money(rows), **token_savings(rows), **time_saved(rows, usd_per_hour),
           "requests": len(rows)}
    ok = [r for r in rows if (r.get("status") or "ok") == "ok"]
    rw = [r["ttft_ms"] for r in ok if not r.get("holdout") and r.get("ttft_ms") is not None]
    ho = [r["ttft_ms"] for r in ok if r.get("holdout") and r.get("ttft_ms") is not None]
    a, b = percentile(rw, 50), percentile(ho, 50)
    out["ttft_p50_diff_ms"] = None if a is None or b is None else a - b
    out["ttft_p50_ms"] = percentile(ttft_values(rows), 50)  # as every group row's
    out["n_rewritten"], out["n_holdout"] = len(rw), len(ho)
    out["holdout_verdict"] = holdout_report(rows, seed)["verdict"] if ho else None
    out["cf_source"] = cf_sources(rows)
    return out


def cf_sources(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How each row's counterfactual was obtained (ledger ``cf_source``): counts of
    ``measured`` / ``modelled`` / ``holdout`` / ``none``, so a report never mixes them silently."""
    out = {"measured": 0, "modelled": 0, "holdout": 0, "none": 0}
    for r in rows:
        src = r.get("cf_source") or ("holdout" if r.get("holdout") else "none")
        out[src if src in out else "none"] += 1
    return out


def stand_back_figures(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Routes where the stand-back switched passes off (ledger ``stood_back``,
    :mod:`prefixgate.cache.savings.stand_back`): ``[{"route", "requests" (sent standing back),
    "passes" (sorted), "reason" (the latest), "last_ts"}]`` by route."""
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        text = r.get("stood_back") or ""
        if not text:
            continue
        names, _, why = text.partition(": ")
        e = acc.setdefault(r.get("route") or "-", {"route": r.get("route") or "-", "requests": 0,
                                                   "passes": set(), "reason": "",
                                                   "last_ts": 0.0})
        e["requests"] += 1
        e["passes"].update(n for n in names.split(",") if n)
        if (r.get("ts") or 0.0) >= e["last_ts"]:
            e["last_ts"], e["reason"] = r.get("ts") or 0.0, why
    return [{**e, "passes": sorted(e["passes"])} for _, e in sorted(acc.items())]


def error_figures(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Failed requests grouped by (status, http_status, error): ``count``, ``last_ts``,
    ``routes`` (sorted), largest count first."""
    acc: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in rows:
        if (r.get("status") or "ok") == "ok":
            continue
        key = (r["status"], int(r.get("http_status") or 0), (r.get("error") or "")[:60])
        e = acc.setdefault(key, {"status": key[0], "http_status": key[1], "error": key[2],
                                 "count": 0, "last_ts": 0.0, "routes": set()})
        e["count"] += 1
        e["last_ts"] = max(e["last_ts"], r.get("ts") or 0.0)
        e["routes"].add(r.get("route") or "-")
    out = [{**e, "routes": sorted(e["routes"])} for e in acc.values()]
    return sorted(out, key=lambda e: (-e["count"], e["status"]))
