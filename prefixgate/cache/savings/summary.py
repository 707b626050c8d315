"""The ``/api/savings`` document (issue 9; shape fixed in the h/savings - h/dash contract),
computed from the ledger: per-minute rollups (:mod:`prefixgate.cache.ledger.rollup`) for sums, series,
lengths and techniques; the range's request rows (a narrow column set) for exact percentiles,
SLOs, per-route timings and the holdout comparison; the break records for the cache breaks
(``breaks``: grouped by cause with cost and fix, ``top_break``: the one the dashboard's first
card shows, or null; :mod:`prefixgate.cache.savings.top_break`, the same as ``prefixgate report``'s).

Units: times unix seconds, durations ms, money USD, shares 0-1. None (JSON null) = not reported,
never 0 in disguise. ``saved_usd = cf_input_usd - input_usd`` over requests priced both ways (the
counterfactual: the client's own body); ``saved_tokens = (cached - cf_cached) + pruned - added``
tokens no longer billed at the full input price (``added``: tokens the passes put in, a hoisted
note; ``pruned`` and ``added`` over the requests whose usage the backend reported: one that failed
or was cut before any usage saved nothing, :func:`prefixgate.cache.ledger.attribution.answered`).
``by_technique`` splits both (:mod:`prefixgate.cache.ledger.attribution`): its ``saved_tokens`` and
``usd``, the ``unattributed`` remainder included, sum to the totals'. SLO attainment is over
requests with that figure; goodput = share of requests with a TTFT that meet the TTFT SLO and the
TPOT SLO (a request of one output token has no TPOT and meets it). Time saved
(``totals.prefill_s_saved`` and the rest, each route's prefill rate):
:mod:`prefixgate.cache.savings.time_saved`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixgate.cache.ledger import rollup
from prefixgate.cache.ledger.attribution import merge_techniques
from prefixgate.cache.ledger.store import CLIENT_ROWS, Ledger
from prefixgate.cache.savings.holdout_stats import holdout_report
from prefixgate.cache.savings.miss_causes import reported_summary
from prefixgate.cache.savings.pd_decisions import pd_summary
from prefixgate.cache.savings.report import NO_ROUTE, percentile, ttft_values
from prefixgate.cache.savings.time_saved import rate_fields, rates, time_saved
from prefixgate.cache.savings.top_break import explain_breaks, top_break
from prefixgate.config.prices import price_for
from prefixgate.config.schema import HoldoutSettings, SloSettings

RANGES: dict[str, tuple[int, int]] = {"1h": (3600, 60), "24h": (86400, 300), "7d": (604800, 3600)}
"""range -> (span seconds, series bucket seconds)."""
ROW_COLUMNS = ("ts", "route", "model", "backend", "status", "prompt_tokens", "cached_tokens",
               "output_tokens", "input_usd", "cf_input_usd", "ttft_ms", "tpot_ms", "queue_ms",
               "prefill_ms", "decode_ms", "holdout", "cf_cached_tokens", "stood_back", "replica",
               "deployment")


def _pct(xs: Iterable[float | None], p: float) -> float | None:
    """:func:`prefixgate.cache.savings.report.percentile` of the known values (None dropped)."""
    return percentile((x for x in xs if x is not None), p)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(v, nd)


def totals(data: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
           premium_usd: float | None) -> dict[str, Any]:
    """The ``totals`` object from merged rollup ``data`` and the range's rows."""
    priced = data.get("priced", 0)
    inp = data.get("input_usd") if priced else None
    cf = data.get("cf_input_usd") if priced else None
    saved = None if inp is None or cf is None else cf - inp
    reuse = data.get("cf_actual_cached", 0) - data.get("cf_cached_tokens", 0)
    src = {"measured": 0, "modelled": 0, "holdout": 0, "none": 0}
    src.update(data.get("cf_source", {}))
    return {
        "requests": data.get("requests", 0), "errors": data.get("errors", 0),
        "input_usd": _r(inp, 8), "cf_input_usd": _r(cf, 8), "saved_usd": _r(saved, 8),
        "saved_pct": _r(_ratio(saved, cf), 6),
        "prompt_tokens": data.get("prompt_tokens", 0),
        "cached_tokens": data.get("cached_tokens", 0),
        "cf_cached_tokens": data.get("cf_cached_tokens", 0),
        "saved_tokens": reuse + data.get("pruned_tokens", 0) - data.get("added_tokens", 0),
        "pruned_tokens": data.get("pruned_tokens", 0),
        "added_tokens": data.get("added_tokens", 0),
        "cached_share": _r(_ratio(data.get("cached_tokens"), data.get("usage_prompt"))),
        "cf_cached_share": _r(_ratio(data.get("cf_cached_tokens"), data.get("cf_prompt"))),
        "ttft_p50_ms": _r(percentile(ttft_values(rows), 50), 3),
        "ttft_p95_ms": _r(percentile(ttft_values(rows), 95), 3),
        "cf_source": src, "no_usage_reported": data.get("no_usage", 0),
        "output_tokens": data.get("output_tokens", 0),
        "cache_write_tokens": data.get("cache_write_tokens", 0),
        "span_reused_tokens": data.get("span_reused_tokens", 0),
        "cache_write_premium_usd": _r(premium_usd, 8),
        "holdout_requests": data.get("holdout", 0),
    }


def write_premium(rolls: Iterable[Mapping[str, Any]]) -> float | None:
    """USD paid above the input price for cache writes (priced models only); None when no
    priced model wrote anything measurable."""
    total, any_priced = 0.0, False
    for r in rolls:
        p = price_for(r["model"])
        if p is None:
            continue
        any_priced = True
        total += r["data"].get("cache_write_tokens", 0) * (p.cache_write_5m - p.input) / 1e6
    return total if any_priced else None


def slots_of(rolls: Sequence[Mapping[str, Any]], from_ts: int, to_ts: int,
             bucket_s: int) -> tuple[int, list[dict[str, Any]]]:
    """(aligned start, one merged rollup ``data`` per ``bucket_s`` from it to ``to_ts``)."""
    start = from_ts // bucket_s * bucket_s
    n = max(1, (to_ts - start + bucket_s - 1) // bucket_s)
    slots: list[dict[str, Any]] = [{} for _ in range(n)]
    for r in rolls:
        i = (r["minute"] - start) // bucket_s
        if 0 <= i < n:
            rollup.merge(slots[i], r["data"])
    return start, slots


def series(start: int, slots: Sequence[Mapping[str, Any]], bucket_s: int) -> dict[str, Any]:
    """The ``series`` object from :func:`slots_of`; buckets without requests have 0 counts
    and null shares / percentiles."""
    n = len(slots)
    out: dict[str, Any] = {"ts": [start + i * bucket_s for i in range(n)], "requests": [],
                           "cached_share": [], "saved_usd": [],
                           "tokens": {"cache_read": [], "cache_write": [], "uncached": [],
                                      "pruned": []},
                           "ttft_ms": {"p50": [], "p95": [], "p99": []},
                           "tpot_ms": {"p50": [], "p95": [], "p99": []}}
    for d in slots:
        out["requests"].append(d.get("requests", 0))
        out["cached_share"].append(_r(_ratio(d.get("cached_tokens"), d.get("usage_prompt"))))
        out["saved_usd"].append(_r(d["cf_input_usd"] - d["input_usd"], 8)
                                if d.get("priced") else None)
        read, write = d.get("cached_tokens", 0), d.get("cache_write_tokens", 0)
        t = out["tokens"]
        t["cache_read"].append(read)
        t["cache_write"].append(write)
        t["uncached"].append(max(0, d.get("usage_prompt", 0) - read - write))
        t["pruned"].append(d.get("pruned_tokens", 0))
        for key, hist in (("ttft_ms", d.get("ttft", {})), ("tpot_ms", d.get("tpot", {}))):
            for p in (50, 95, 99):
                out[key][f"p{p}"].append(_r(rollup.hist_percentile(hist, p), 3))
    return out


def slo_table(rows: Sequence[Mapping[str, Any]], slo: SloSettings) -> list[dict[str, Any]]:
    """Per route: its SLO, requests, attainment of each, goodput (module docstring)."""
    by: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if (r.get("status") or "ok") == "ok":
            by[r.get("route") or "-"].append(r)
    out = []
    for route, rs in sorted(by.items()):
        s = slo.for_route(route)
        tt = [r["ttft_ms"] for r in rs if r.get("ttft_ms") is not None]
        tp = [r["tpot_ms"] for r in rs if r.get("tpot_ms") is not None]
        good = [r for r in rs if r.get("ttft_ms") is not None and r["ttft_ms"] <= s.ttft_ms
                and (r.get("tpot_ms") is None or r["tpot_ms"] <= s.tpot_ms)]
        out.append({"route": route, "ttft_ms": s.ttft_ms, "tpot_ms": s.tpot_ms,
                    "requests": len(rs), "n_ttft": len(tt), "n_tpot": len(tp),
                    "ttft_attainment": _r(_ratio(sum(x <= s.ttft_ms for x in tt), len(tt))),
                    "tpot_attainment": _r(_ratio(sum(x <= s.tpot_ms for x in tp), len(tp))),
                    "goodput": _r(_ratio(len(good), len(tt)))})
    return out


def hit_rate(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """Prefix-cache hit rate: share of requests reporting cached tokens that had any (> 0);
    None when none reported."""
    known = [r["cached_tokens"] for r in rows if r.get("cached_tokens") is not None]
    return sum(1 for c in known if c > 0) / len(known) if known else None


ROUTES_TOP = 50
"""Rows of the routes table: the (route, model, backend) keys with the most requests; the rest
are summed into one :data:`OTHER` row (issue 34 item 16: model names are the client's, so 3,000
names made 3,010 rows, 2.2 MB per poll)."""
OTHER = "(other)"


def _top_keys(sums: Mapping[tuple[str, str, str], Mapping[str, Any]], top: int
              ) -> set[tuple[str, str, str]]:
    """The ``top`` keys by requests (ties by key), all of them when there are no more."""
    if len(sums) <= top:
        return set(sums)
    ranked = sorted(sums, key=lambda k: (-int(sums[k].get("requests", 0)), k))
    return set(ranked[:top])


def routes_table(rolls: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
                 usd_per_hour: Mapping[str, float | None] | None = None,
                 top: int = ROUTES_TOP) -> list[dict[str, Any]]:
    """Per (route, model, backend): counts and shares from rollups, timings from rows, the
    prefill rate of (route, backend) and the time it saved (:mod:`prefixgate.cache.savings.time_saved`).

    At most ``top`` keys get a row of their own (those with the most requests), sorted by key;
    past that one last row sums the rest: route, model and backend :data:`OTHER`, ``other_keys``
    the number of keys it holds, its timings over their rows (its prefill rate: none of its
    own). So the table stays ``top + 1`` rows whatever the clients name."""
    known = rates(rows)
    sums: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(dict)
    for r in rolls:
        rollup.merge(sums[(r["route"], r["model"], r["backend"])], r["data"])
    by: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r.get("route") or "", r.get("model") or "", r.get("backend") or "")].append(r)
    keep = _top_keys(sums, top)
    other: dict[str, Any] = {}
    other_rows: list[Mapping[str, Any]] = []
    for key in sums.keys() - keep:
        rollup.merge(other, sums[key])
        other_rows += by.get(key, [])
    items = sorted((k, sums[k]) for k in keep)
    if len(keep) < len(sums):
        items.append(((OTHER, OTHER, OTHER), other))
        by[(OTHER, OTHER, OTHER)] = other_rows
    out = []
    for key, d in items:
        rs = by.get(key, [])
        out.append({
            "route": key[0] or NO_ROUTE, "model": key[1], "backend": key[2],
            "requests": d.get("requests", 0), "errors": d.get("errors", 0),
            "cached_share": _r(_ratio(d.get("cached_tokens"), d.get("usage_prompt"))),
            "cache_hit_rate": _r(hit_rate(rs)),
            "saved_usd": _r(d["cf_input_usd"] - d["input_usd"], 8) if d.get("priced") else None,
            "ttft_p50_ms": _r(percentile(ttft_values(rs), 50), 3),
            "ttft_p95_ms": _r(percentile(ttft_values(rs), 95), 3),
            "tpot_p50_ms": _r(_pct((r["tpot_ms"] for r in rs), 50), 3),
            "queue_ms_p50": _r(_pct((r["queue_ms"] for r in rs), 50), 3),
            "prefill_ms_p50": _r(_pct((r["prefill_ms"] for r in rs), 50), 3),
            "decode_ms_p50": _r(_pct((r["decode_ms"] for r in rs), 50), 3),
            "lengths": lengths(d),
            **rate_fields(known.get((key[0] or "-", key[2] or "-"))),
            **time_saved(rs, usd_per_hour, known),
            "stood_back": stood_back_of(rs),
            "pd": (pd := pd_summary(rs)),  # P/D backends: split / colocate counts, reasons
            "pd_split_share": pd["split_share"] if pd else None,
        })
    if len(keep) < len(sums):
        out[-1]["other_keys"] = len(sums) - len(keep)
    return out


def stood_back_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``{"requests", "passes", "reason"}`` of a route's requests sent while its stand-back held
    (:mod:`prefixgate.cache.savings.stand_back`; the latest reason), None when none was."""
    marked = [r["stood_back"] for r in rows if r.get("stood_back")]
    if not marked:
        return None
    passes = sorted({n for m in marked for n in m.partition(": ")[0].split(",") if n})
    return {"requests": len(marked), "passes": passes, "reason": marked[-1].partition(": ")[2]}


def lengths(data: Mapping[str, Any]) -> dict[str, Any]:
    """Prompt / output length histograms (``counts[i]``: edges[i] <= tokens < edges[i+1], the
    last bucket open)."""
    return {"prompt": {"edges": rollup.PROMPT_EDGES,
                       "counts": rollup.counts_over(data.get("plen", {}),
                                                    len(rollup.PROMPT_EDGES))},
            "output": {"edges": rollup.OUTPUT_EDGES,
                       "counts": rollup.counts_over(data.get("olen", {}),
                                                    len(rollup.OUTPUT_EDGES))}}


def range_rows(ledger: Ledger, from_ts: float, to_ts: float,
               tenant: str | None = None) -> list[dict[str, Any]]:
    """The range's client request rows (no meaning-guard trial send, :data:`CLIENT_ROWS`),
    :data:`ROW_COLUMNS` only (no prompt text exists anyway);
    ``tenant``'s only when given (:func:`prefixgate.cache.ledger.rollup.tenant_filter`)."""
    where, params = rollup.tenant_filter(tenant)
    got = ledger.query(f"SELECT {', '.join(ROW_COLUMNS)} FROM requests WHERE ts >= ? AND ts < ?"
                       f" AND {CLIENT_ROWS}{where} ORDER BY id", (from_ts, to_ts, *params))
    return [dict(zip(ROW_COLUMNS, r)) for r in got]


def savings_document(ledger: Ledger, range_: str = "1h", *, slo: SloSettings | None = None,
                     holdout: HoldoutSettings | None = None, now: float | None = None,
                     usd_per_hour: Mapping[str, float | None] | None = None,
                     tenant: str | None = None) -> dict[str, Any]:
    """The whole ``/api/savings?range=`` document. Raises ``KeyError`` for an unknown range
    (the HTTP layer answers 400). ``usd_per_hour``: backend name -> the policy's hourly price.
    ``tenant``: every figure from that tenant's (and its sub-tenants') rows, rollups and breaks
    only (None: all tenants)."""
    span, bucket_s = RANGES[range_]
    to_ts = int(now if now is not None else time.time()) + 1
    from_ts = to_ts - span
    rolls = ledger.rollups(from_ts, to_ts, tenant)
    rows = range_rows(ledger, from_ts, to_ts, tenant)
    start, slots = slots_of(rolls, from_ts, to_ts, bucket_s)
    data = rollup.total({"data": d} for d in slots)
    hs = holdout or HoldoutSettings()
    ho = holdout_report(rows, hs.seed)
    explained = explain_breaks(ledger.breaks(from_ts, tenant), rows)
    return {
        "range": range_, "from_ts": from_ts, "to_ts": to_ts, "bucket_s": bucket_s,
        "totals": {**totals(data, rows, write_premium(rolls)), **time_saved(rows, usd_per_hour)},
        "by_technique": [t.to_dict() for t in merge_techniques(
            r["data"].get("tech", {}) for r in rolls)],
        "holdout": {"enabled": hs.fraction > 0, "fraction": hs.fraction,
                    "verdict": ho["verdict"], "reason": ho["reason"], "overall": ho["overall"],
                    "buckets": ho["buckets"]},
        "series": series(start, slots, bucket_s),
        "slo": slo_table(rows, slo or SloSettings()),
        "lengths": lengths(data),
        "breaks": explained,
        "top_break": top_break(explained, rows),
        "routes": routes_table(rolls, rows, usd_per_hour),
        "replicas": replicas_table(rows),
        "provider_misses": provider_misses(ledger, from_ts, to_ts, tenant),
    }


def provider_misses(ledger: Ledger, from_ts: float, to_ts: float,
                    tenant: str | None = None) -> dict[str, Any]:
    """The providers' own cache-miss reasons in the range and prefixgate's agreement with them
    (:func:`prefixgate.cache.savings.miss_causes.reported_summary`), from the rows that carry
    one."""
    where, params = rollup.tenant_filter(tenant)
    cols = ("reported_miss", "reported_missed_tokens", "predicted_miss")
    got = ledger.query(f"SELECT {', '.join(cols)} FROM requests WHERE ts >= ? AND ts < ? "
                       f"AND reported_miss != '' AND {CLIENT_ROWS}{where}",
                       (from_ts, to_ts, *params))
    return reported_summary(dict(zip(cols, r)) for r in got)


def replicas_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The range's traffic split by the replica that served it (issue 26: several proxies, one
    ledger), sorted by name: ``{"replica", "requests", "errors", "cached_share" (cached /
    prompt tokens of rows reporting both, None without), "ttft_p50_ms", "last_ts"}``. Rows
    written before the column existed count under ``"-"``."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(r.get("replica") or "-", []).append(r)
    out = []
    for name in sorted(by):
        rs = by[name]
        both = [r for r in rs if r.get("prompt_tokens") is not None
                and r.get("cached_tokens") is not None]
        out.append({
            "replica": name, "requests": len(rs),
            "errors": sum(1 for r in rs if (r.get("status") or "ok") != "ok"),
            "cached_share": _r(_ratio(sum(r["cached_tokens"] for r in both),
                                      sum(r["prompt_tokens"] for r in both))) if both else None,
            "ttft_p50_ms": _r(percentile(ttft_values(rs), 50), 3),
            "last_ts": max(float(r.get("ts") or 0) for r in rs),
        })
    return out
