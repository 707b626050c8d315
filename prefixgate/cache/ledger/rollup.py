"""Per-minute rollups kept beside the ledger (issue 9, item 5), so 1 h / 24 h / 7 d views read
at most 10,080 small rows per (route, model, backend) instead of every request.

Table ``rollup_tenant_minutes`` in the ledger's SQLite file, one row per (minute, route, model,
backend, tenant) — the tenant so that one tenant's view (:func:`read` with ``tenant``) never
sums another's rows (issue 20, Medium 8; it replaced ``rollup_minutes``, which had no tenant and
is dropped once the new table is filled from the request rows) — : ``minute`` = unix seconds
floored to 60, ``data`` = a JSON object of sums
(:func:`fold`), merged by :func:`merge` — the ledger writer updates it in the same transaction
as the request row (:func:`upsert`), so the two never disagree. Fields of ``data``::

    requests errors no_usage holdout        counts
    prompt_tokens output_tokens pruned_tokens          tokens (NULL usage counts as 0 here,
                                                        and so do its pruned tokens:
                                                        no usage, no saving counted;
    usage_prompt cached_tokens cache_write_tokens      ``no_usage`` says how many were NULL);
                                                        usage_prompt = prompt tokens of rows
                                                        that reported cached tokens too
    span_reused_tokens                      of those cached tokens, the ones our engine reused
                                            across a changed span (issue 33; rows that
                                            reported both; absent: none did)
    cf_prompt cf_cached_tokens              prompt / counterfactual / actual cached tokens of
    cf_actual_cached                        rows with a counterfactual
    added_tokens                            tokens the passes added (``pass_tokens`` added)
    priced input_usd cf_input_usd           rows priced both ways, and their USD sums
    cf_source {measured, modelled, holdout, none}
    ttft tpot   {bucket index: count} over :data:`LAT_EDGES_MS`
    plen olen   {bucket index: count} over :data:`PROMPT_EDGES` / :data:`OUTPUT_EDGES`
    tech        {pass: {reusable, removed, added, usd}} with the ``unattributed`` remainder
                (:func:`prefixgate.cache.ledger.attribution.row_techniques`: the parts add up)

Latency buckets are geometric (x1.25), so a percentile read from them (:func:`hist_percentile`)
is within 12.5 % of the exact one; exact percentiles come from the request rows.
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from prefixgate.cache.ledger.attribution import row_techniques

TABLE = "rollup_tenant_minutes"
OLD_TABLES = ("rollup_minutes",)
"""Rollup tables of earlier versions, dropped once :data:`TABLE` is filled."""
LAT_EDGES_MS: list[float] = [0.0] + [round(1.25 ** i, 3) for i in range(0, 61)]
"""0, 1 ms, 1.25 ms, ... ~ 813 s: bucket i is [edges[i], edges[i+1]); the last is open."""
PROMPT_EDGES: list[int] = [0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
OUTPUT_EDGES: list[int] = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
SENT_AS_IS = ("none", "off", "unavailable", "over_budget", "rewrite_failed")
"""Edit summaries of bodies that went upstream as the client sent them."""


def create(db: sqlite3.Connection) -> None:
    """Create the rollup table if missing."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (minute INTEGER, route TEXT, model TEXT, "
               "backend TEXT, tenant TEXT, data TEXT, "
               "PRIMARY KEY (minute, route, model, backend, tenant))")


def tenant_filter(tenant: str | None) -> tuple[str, tuple[Any, ...]]:
    """SQL ``AND ...`` (and its parameters) keeping the rows of ``tenant`` and of its
    sub-tenants (``<tenant>/...``, :mod:`prefixgate.proxy.http.tenants`); None: every row.
    Compares text exactly (no ``LIKE``: ``_`` is a wildcard there and legal in a tenant)."""
    if tenant is None:
        return "", ()
    return (" AND (tenant = ? OR substr(tenant, 1, ?) = ?)",
            (tenant, len(tenant) + 1, tenant + "/"))


def bucket(edges: list[float] | list[int], v: float) -> int:
    """Index of the bucket of ``v`` (values below the first edge go to bucket 0)."""
    return max(0, bisect.bisect_right(edges, v) - 1)


def cf_source_of(row: Mapping[str, Any]) -> str:
    """measured | modelled | holdout | none for one row: the row's ``cf_source`` when set;
    otherwise ``holdout`` for holdout rows, ``none`` without a counterfactual, ``measured`` when
    the body went out as sent (its counterfactual is its own usage), else ``modelled``."""
    src = row.get("cf_source") or ""
    if src in ("measured", "modelled", "holdout"):
        return str(src)
    if row.get("holdout"):
        return "holdout"
    if row.get("cf_cached_tokens") is None:
        return "none"
    return "measured" if (row.get("edits") or "none") in SENT_AS_IS else "modelled"


def fold(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ledger row (dict of columns) as a rollup ``data`` object (module docstring)."""
    prompt, cached = row.get("prompt_tokens"), row.get("cached_tokens")
    write, out = row.get("cache_write_tokens"), row.get("output_tokens")
    d: dict[str, Any] = {
        "requests": 1, "errors": int((row.get("status") or "ok") != "ok"),
        "no_usage": int(prompt is None), "holdout": int(bool(row.get("holdout"))),
        "prompt_tokens": prompt or 0, "output_tokens": out or 0,
        "pruned_tokens": (row.get("tokens_pruned") or 0) if prompt is not None else 0,
        "cf_source": {cf_source_of(row): 1},
    }
    if prompt is not None and cached is not None:
        d["usage_prompt"], d["cached_tokens"] = prompt, cached
        d["cache_write_tokens"] = write or 0
        if row.get("span_reused_tokens") is not None:
            d["span_reused_tokens"] = row["span_reused_tokens"]
    if prompt is not None and row.get("cf_cached_tokens") is not None:
        d["cf_prompt"], d["cf_cached_tokens"] = prompt, row["cf_cached_tokens"]
        d["cf_actual_cached"] = cached or 0
    if row.get("input_usd") is not None and row.get("cf_input_usd") is not None:
        d["priced"], d["input_usd"], d["cf_input_usd"] = 1, row["input_usd"], row["cf_input_usd"]
    if row.get("ttft_ms") is not None:
        d["ttft"] = {str(bucket(LAT_EDGES_MS, row["ttft_ms"])): 1}
    if row.get("tpot_ms") is not None:
        d["tpot"] = {str(bucket(LAT_EDGES_MS, row["tpot_ms"])): 1}
    if prompt is not None:
        d["plen"] = {str(bucket(PROMPT_EDGES, prompt)): 1}
    if out is not None:
        d["olen"] = {str(bucket(OUTPUT_EDGES, out)): 1}
    tech = row_techniques(row)
    if tech:
        d["tech"] = tech
        d["added_tokens"] = sum(int(f["added"]) for f in tech.values())
    return d


def merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``b`` into ``a`` (numbers add, objects merge recursively, None + x = x); returns
    ``a``."""
    for k, v in b.items():
        if isinstance(v, Mapping):
            merge(a.setdefault(k, {}), v)
        elif v is None:
            a.setdefault(k, None)
        elif a.get(k) is None:
            a[k] = v
        else:
            a[k] = a[k] + v
    return a


def _key(row: Mapping[str, Any]) -> tuple[int, str, str, str, str]:
    return (int(row["ts"]) // 60 * 60, row.get("route") or "", row.get("model") or "",
            row.get("backend") or "", row.get("tenant") or "")


def _load(db: sqlite3.Connection, key: tuple[int, str, str, str, str]) -> dict[str, Any]:
    cur = db.execute(f"SELECT data FROM {TABLE} WHERE minute=? AND route=? AND model=? "
                     "AND backend=? AND tenant=?", key).fetchone()
    return json.loads(cur[0]) if cur else {}


def _store(db: sqlite3.Connection, key: tuple[int, str, str, str, str],
           data: dict[str, Any]) -> None:
    db.execute(f"INSERT OR REPLACE INTO {TABLE} (minute, route, model, backend, tenant, data) "
               "VALUES (?, ?, ?, ?, ?, ?)", (*key, json.dumps(data, separators=(",", ":"))))


def counted(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is folded into the rollups: a client's request, not a meaning-guard
    trial send (``trial`` set; issue 36: trial traffic is never a saving)."""
    return not row.get("trial")


def upsert(db: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    """Fold ``row`` into its minute's rollup (call inside the writer's transaction); a trial
    row (:func:`counted`) is left out."""
    if not counted(row):
        return
    key = _key(row)
    _store(db, key, merge(_load(db, key), fold(row)))


def upsert_many(db: sqlite3.Connection, rows: Iterable[Mapping[str, Any]]) -> None:
    """:func:`upsert` of each row in order, with one read and one write per rollup row touched
    instead of per ledger row (a batch of the writer thread mostly shares one minute). The
    same additions in the same order: the stored data is what row-by-row upserts store."""
    datas: dict[tuple[int, str, str, str, str], dict[str, Any]] = {}
    for row in rows:
        if not counted(row):
            continue
        key = _key(row)
        data = datas.get(key)
        if data is None:
            data = datas[key] = _load(db, key)
        merge(data, fold(row))
    for key, data in datas.items():
        _store(db, key, data)


def read(db: sqlite3.Connection, from_ts: float, to_ts: float,
         tenant: str | None = None) -> list[dict[str, Any]]:
    """Rollup rows with ``from_ts <= minute < to_ts`` (minute floored), oldest first:
    ``{"minute", "route", "model", "backend", "tenant", "data"}``; ``tenant``: only that
    tenant's and its sub-tenants' (:func:`tenant_filter`; None: all)."""
    lo = int(from_ts) // 60 * 60
    where, params = tenant_filter(tenant)
    cur = db.execute(f"SELECT minute, route, model, backend, tenant, data FROM {TABLE} "
                     f"WHERE minute >= ? AND minute < ?{where} ORDER BY minute",
                     (lo, to_ts, *params))
    return [{"minute": m, "route": r, "model": mo, "backend": b, "tenant": t,
             "data": json.loads(d)} for m, r, mo, b, t, d in cur.fetchall()]


def hist_percentile(hist: Mapping[str, int], p: float,
                    edges: list[float] = LAT_EDGES_MS) -> float | None:
    """``p``-th percentile (0-100) of a bucket histogram, linear within the bucket; None when
    empty. The open last bucket reports its lower edge."""
    counts = sorted((int(k), int(v)) for k, v in hist.items() if v)
    n = sum(c for _, c in counts)
    if n == 0:
        return None
    target = p / 100.0 * n
    seen = 0
    for i, c in counts:
        if seen + c >= target:
            lo = edges[i]
            hi = edges[i + 1] if i + 1 < len(edges) else lo
            return lo + (hi - lo) * max(0.0, target - seen) / c
        seen += c
    return float(edges[counts[-1][0]])


def counts_over(hist: Mapping[str, int], n_edges: int) -> list[int]:
    """A sparse ``{index: count}`` histogram as a dense list of ``n_edges`` counts."""
    out = [0] * n_edges
    for k, v in hist.items():
        i = int(k)
        if 0 <= i < n_edges:
            out[i] += int(v)
    return out


def total(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the ``data`` of several rollup rows into one object."""
    acc: dict[str, Any] = {}
    for r in rows:
        merge(acc, r["data"])
    return acc
