"""``GET /api/savings`` payloads for the dashboard tests, and a checker for the contract.

The contract (``/work/notes/savings_api.md``, written into issue 9's design): times unix seconds,
durations ms, money USD, shares 0..1, ``null`` = not reported (never 0 in disguise). These
payloads are built to be self-consistent (totals = sums of the series, shares = ratios) so the
page is tested on data that could really come out of the ledger:

- :func:`busy_payload` — requests in every bucket, two routes, three techniques, a holdout
  with a verdict, cache breaks, every latency reported except TPOT in some buckets.
- :func:`quiet_payload` — a range where the backend reported no usage and no timings: every
  latency and token series ``null``, no techniques, no breaks, holdout off.
- :func:`idle_payload` — a range without requests.

:func:`contract_errors` lists how a payload departs from the contract's fixed names and shapes
(used on these payloads and on the real endpoint's answers).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from prefixgate.config.schema import AuthSettings, ProxyKey
from prefixgate.proxy.core.errors import Unauthorized, error_response
from prefixgate.proxy.http.auth import Guard, KeyStore, hash_key
from prefixgate.proxy.http.ratelimit import MemoryLimiter
from prefixgate.proxy.observe import dashboard

KEY = "pgk-" + "d" * 43  # a proxy key for the auth tests (see keyed_guard)
RANGE_SECONDS = {"1h": (3600, 60), "24h": (86400, 900), "7d": (7 * 86400, 3600)}


def keyed_guard() -> Guard:
    """A guard whose only proxy key is :data:`KEY` (id ``k_dash``), no rate limits."""
    return Guard(KeyStore(AuthSettings(keys=[ProxyKey(id="k_dash", hash=hash_key(KEY))])),
                 MemoryLimiter())


def _times(rng: str, to_ts: int, n: int) -> tuple[int, int, list[int]]:
    span, bucket = RANGE_SECONDS[rng]
    from_ts = to_ts - span
    first = to_ts - n * bucket
    return from_ts, bucket, [first + i * bucket for i in range(n)]


def busy_payload(rng: str = "1h", to_ts: int = 1_790_000_000, n: int = 24) -> dict[str, Any]:
    """A range with traffic in ``n`` buckets (see module docstring)."""
    from_ts, bucket, ts = _times(rng, to_ts, n)
    top = dict(TOP_BREAK)
    requests = [3 + (i * 7) % 5 for i in range(n)]
    cache_read = [r * (900 + 40 * i) for i, r in enumerate(requests)]
    cache_write = [r * (120 if i % 4 == 0 else 0) for i, r in enumerate(requests)]
    uncached = [r * (300 + 15 * (i % 6)) for i, r in enumerate(requests)]
    pruned = [r * (50 if i % 3 else 0) for i, r in enumerate(requests)]
    prompt = [a + b + c for a, b, c in zip(cache_read, cache_write, uncached, strict=True)]
    cached_share = [round(a / p, 6) for a, p in zip(cache_read, prompt, strict=True)]
    saved_usd = [round(a * 2.25e-6, 6) for a in cache_read]
    p50 = [round(180 + 25 * math.sin(i / 3), 1) for i in range(n)]
    tpot50: list[float | None] = [None if i % 5 == 4 else round(22 + (i % 4), 1) for i in range(n)]
    total_req, total_prompt, total_read = sum(requests), sum(prompt), sum(cache_read)
    saved = round(sum(saved_usd), 6)
    input_usd = round(total_prompt * 2.5e-6 - total_read * 2.25e-6, 6)
    cf_input = round(input_usd + saved, 6)
    cmp = {"rewritten": 0.62, "holdout": 0.41, "diff": 0.21, "ci95": [0.12, 0.3]}
    usd = {"rewritten": 0.0021, "holdout": 0.0034, "diff": -0.0013, "ci95": [-0.0019, -0.0007]}
    return {
        "range": rng, "from_ts": from_ts, "to_ts": to_ts, "bucket_s": bucket,
        "totals": {
            "requests": total_req, "errors": 2,
            "input_usd": input_usd, "cf_input_usd": cf_input, "saved_usd": saved,
            "saved_pct": round(saved / cf_input, 6),
            "prompt_tokens": total_prompt, "cached_tokens": total_read,
            "cf_cached_tokens": total_read // 3, "saved_tokens": total_read - total_read // 3,
            "pruned_tokens": sum(pruned), "cached_share": round(total_read / total_prompt, 6),
            "cf_cached_share": round(total_read / 3 / total_prompt, 6), "ttft_p50_ms": 181.5,
            "ttft_p95_ms": 296.0, "cache_write_premium_usd": 0.00041,
            "cf_source": {"measured": total_req - 10, "modelled": 6, "holdout": 4, "none": 0},
            "no_usage_reported": 1,
            "prefill_s_saved": 12.345, "prefill_s_cached": 48.2, "prefill_usd_saved": None,
            "ttft_s_saved_holdout": 3.5, "rows_with_rate": 20,
        },
        "by_technique": [
            {"technique": "hoist_volatile", "tokens_reusable": 41234, "tokens_removed": 0,
             "tokens_added": 12, "usd": 0.0912},
            {"technique": "prune_tools", "tokens_reusable": 0, "tokens_removed": sum(pruned),
             "tokens_added": 0, "usd": 0.0075},
            {"technique": "cache_breakpoints", "tokens_reusable": 8800, "tokens_removed": 0,
             "tokens_added": 0, "usd": None},
        ],
        "holdout": {
            "enabled": True, "fraction": 0.1, "verdict": "rewriting helps",
            "reason": "better cached_share, input_usd_per_request",
            "overall": {"n_rewritten": 100, "n_holdout": 11, "cached_share": cmp,
                        "input_usd_per_request": usd,
                        "ttft_p50_ms": {"rewritten": 170.0, "holdout": 229.5, "diff": -59.5, "ci95": [-80.0, -38.25]},
                        "ttft_p95_ms": {"rewritten": 255.0, "holdout": 380.0, "diff": -125.0, "ci95": [-190.0, -55.0]},
                        "verdict": "rewriting helps"},
            "buckets": [
                {"bucket": "0-1k", "n_rewritten": 40, "n_holdout": 3,
                 "cached_share": {"rewritten": 0.5, "holdout": 0.48, "diff": 0.02, "ci95": [-0.1, 0.14]},
                 "input_usd_per_request": {"rewritten": 0.0009, "holdout": 0.001, "diff": -0.0001,
                                           "ci95": [-0.0004, 0.0002]},
                 "ttft_p50_ms": {"rewritten": 150.0, "holdout": 160.0, "diff": -10.0, "ci95": [-40.0, 20.0]},
                 "ttft_p95_ms": {"rewritten": None, "holdout": None, "diff": None, "ci95": [None, None]},
                 "verdict": "inconclusive"},
                {"bucket": "1k-4k", "n_rewritten": 60, "n_holdout": 8, "cached_share": cmp,
                 "input_usd_per_request": usd,
                 "ttft_p50_ms": {"rewritten": 175.2, "holdout": 240.8, "diff": -65.6, "ci95": [-90.1, -41.0]},
                 "ttft_p95_ms": {"rewritten": 260.0, "holdout": 390.5, "diff": -130.5, "ci95": [-200.0, -60.0]},
                 "verdict": "rewriting helps"},
            ],
        },
        "series": {
            "ts": ts, "requests": requests, "cached_share": cached_share, "saved_usd": saved_usd,
            "tokens": {"cache_read": cache_read, "cache_write": cache_write, "uncached": uncached,
                       "pruned": pruned},
            "ttft_ms": {"p50": p50, "p95": [round(v * 1.6, 1) for v in p50],
                        "p99": [round(v * 2.1, 1) for v in p50]},
            "tpot_ms": {"p50": tpot50, "p95": [None if v is None else round(v * 1.5, 1) for v in tpot50],
                        "p99": [None if v is None else round(v * 1.9, 1) for v in tpot50]},
        },
        "slo": [
            {"route": "default", "ttft_ms": 300, "tpot_ms": 30, "requests": total_req - 20,
             "ttft_attainment": 0.931, "tpot_attainment": 0.874, "goodput": 0.842},
            {"route": "claude", "ttft_ms": 800, "tpot_ms": None, "requests": 20,
             "ttft_attainment": 1.0, "tpot_attainment": None, "goodput": None},
        ],
        "lengths": {
            "prompt": {"edges": [0, 256, 1024, 4096, 16384], "counts": [3, 17, 52, 30, 0]},
            "output": {"edges": [0, 64, 256, 1024], "counts": [41, 38, 19, 4]},
        },
        "breaks": [top, *BREAKS_MORE],
        "top_break": top,
        "guard": [  # issue 36: the meaning guard's verdicts (MeaningGuard.snapshot)
            {"route": "default", "tenant": "", "move": "hoist_volatile", "state": "trialling",
             "pairs": 12, "move_rate": 0.083, "floor_rate": 0.0, "reason": "", "expires_at": 0.0},
            {"route": "claude", "tenant": "", "move": "prune_tools", "state": "on",
             "pairs": 40, "move_rate": 0.0, "floor_rate": 0.025, "reason": "upper < margin",
             "expires_at": 1900000000.0}],
        "routes": [
            {"route": "default", "model": "gpt-4o", "backend": "openai", "requests": total_req - 20,
             "errors": 2, "cached_share": 0.703, "saved_usd": round(saved - 0.0123, 6),
             "ttft_p50_ms": 181.5, "ttft_p95_ms": 296.0, "tpot_p50_ms": 23.4, "queue_ms_p50": None,
             "prefill_ms_p50": None, "decode_ms_p50": None, "prefill_ms_per_token": None,
             "prefill_s_saved": None},
            {"route": "claude", "model": "claude-sonnet-4-5", "backend": "anthropic", "requests": 20,
             "errors": 0, "cached_share": 0.655, "saved_usd": 0.0123, "ttft_p50_ms": 402.25,
             "ttft_p95_ms": 771.0, "tpot_p50_ms": None, "queue_ms_p50": 1.5, "prefill_ms_p50": 88.0,
             "decode_ms_p50": 310.75, "prefill_ms_per_token": 0.0525, "prefill_s_saved": 12.345,
             "pd": {"split": 6, "colocate": 14, "split_share": 0.3,
                    "reasons": {"colocate:prefix_hit": 14, "split:split": 6}},
             "pd_split_share": 0.3},
        ],
    }


def slow_payload(rng: str = "1h") -> dict[str, Any]:
    """:func:`busy_payload` from a slow backend (issue 22, item 7: a TTFT axis reaching 10,000
    ms was drawn as "0,000 ms"): TTFT p50 up to ~9 s, p99 ~21 s, an SLO line at 12 s, and
    savings in the thousands of dollars, so every y axis has long tick labels."""
    p = busy_payload(rng)
    s = p["series"]
    p50 = [round(6000 + 3000 * math.sin(i / 3), 1) for i in range(len(s["ts"]))]
    s["ttft_ms"] = {"p50": p50, "p95": [round(v * 1.6, 1) for v in p50],
                    "p99": [round(v * 2.3, 1) for v in p50]}
    s["saved_usd"] = [round(1234.5 + 100 * i, 2) for i in range(len(s["ts"]))]
    p["slo"][0]["ttft_ms"] = 12000
    return p


def selfhosted_payload(rng: str = "1h") -> dict[str, Any]:
    """:func:`busy_payload` as a self-hosted engine's range: nothing priced (no table price, no
    ``price_per_mtok``), the prefill time measured: the page leads with the time saved."""
    p = busy_payload(rng)
    t = p["totals"]
    t.update(input_usd=None, cf_input_usd=None, saved_usd=None, saved_pct=None,
             cache_write_premium_usd=None)
    p["series"]["saved_usd"] = [None] * len(p["series"]["ts"])
    for r in p["routes"]:
        r["saved_usd"] = None
    for t_ in p["by_technique"]:
        t_["usd"] = None
    return p


def quiet_payload(rng: str = "1h", to_ts: int = 1_790_000_000, n: int = 6) -> dict[str, Any]:
    """A range whose requests reported no usage and no timings (see module docstring)."""
    from_ts, bucket, ts = _times(rng, to_ts, n)
    nulls: list[Any] = [None] * n
    return {
        "range": rng, "from_ts": from_ts, "to_ts": to_ts, "bucket_s": bucket,
        "totals": {"requests": n, "errors": 0, "input_usd": None, "cf_input_usd": None,
                   "saved_usd": None, "saved_pct": None, "prompt_tokens": None,
                   "cached_tokens": None, "cf_cached_tokens": None, "saved_tokens": None,
                   "pruned_tokens": 0, "cached_share": None, "cf_cached_share": None,
                   "ttft_p50_ms": None,
                   "cf_source": {"measured": 0, "modelled": 0, "holdout": 0, "none": n},
                   "no_usage_reported": n},
        "by_technique": [],
        "holdout": {"enabled": False, "fraction": 0.0, "verdict": "inconclusive", "buckets": []},
        "series": {"ts": ts, "requests": [1] * n, "cached_share": nulls, "saved_usd": nulls,
                   "tokens": {"cache_read": nulls, "cache_write": nulls, "uncached": nulls,
                              "pruned": [0] * n},
                   "ttft_ms": {"p50": nulls, "p95": nulls, "p99": nulls},
                   "tpot_ms": {"p50": nulls, "p95": nulls, "p99": nulls}},
        "slo": [],
        "lengths": {"prompt": {"edges": [0, 256, 1024], "counts": [None, None, None]},
                    "output": {"edges": [0, 64, 256], "counts": [None, None, None]}},
        "breaks": [],
        "routes": [{"route": "default", "model": "m", "backend": "b", "requests": n, "errors": 0,
                    "cached_share": None, "saved_usd": None, "ttft_p50_ms": None,
                    "ttft_p95_ms": None, "tpot_p50_ms": None, "queue_ms_p50": None,
                    "prefill_ms_p50": None, "decode_ms_p50": None}],
    }


def idle_payload(rng: str = "1h", to_ts: int = 1_790_000_000, n: int = 60) -> dict[str, Any]:
    """A range without a single request: zero counts, null shares and percentiles."""
    p = quiet_payload(rng, to_ts, n)
    zeros: list[Any] = [0] * n
    p["totals"].update(requests=0, no_usage_reported=0, prompt_tokens=0, cached_tokens=0,
                       cf_cached_tokens=0, saved_tokens=0)
    p["totals"]["cf_source"]["none"] = 0
    p["series"].update(requests=zeros, tokens={"cache_read": zeros, "cache_write": zeros,
                                               "uncached": zeros, "pruned": zeros})
    p["lengths"] = {"prompt": {"edges": [0, 256, 1024], "counts": [0, 0, 0]},
                    "output": {"edges": [0, 64, 256], "counts": [0, 0, 0]}}
    p["routes"] = []
    return p


# The contract's fixed names: section -> fields (numbers or null unless said otherwise).
TOTALS = ("requests", "errors", "input_usd", "cf_input_usd", "saved_usd", "saved_pct",
          "prompt_tokens", "cached_tokens", "cf_cached_tokens", "saved_tokens", "pruned_tokens",
          "cached_share", "cf_cached_share", "ttft_p50_ms", "no_usage_reported")
TECHNIQUE = ("tokens_reusable", "tokens_removed", "tokens_added", "usd")
SLO = ("ttft_ms", "tpot_ms", "requests", "ttft_attainment", "tpot_attainment", "goodput")
BREAK = ("token_offset", "tokens_lost", "count")
TOP_BREAK = {
    "kind": "volatile_span", "field": "system",
    "cause": "a clock in the system prompt changes on every request",
    "excerpt": "Current time: \u27e8datetime\u27e9", "line": 2, "detail": "system[0] differs",
    "token_offset": 37, "token_offset_max": 38, "model": "gpt-4o", "count": 9, "sessions": 2,
    "tokens_lost": 18211, "seconds_lost": None, "usd_lost": 0.0410, "share": 0.41,
    "fix": "rewrite: {hoist_volatile: true}",
    "fix_note": "moves the changing line after the conversation, so everything before it is reused",
    "unit": "estimate", "unit_text": "estimated tokens (tiktoken), counting tools, then system, then messages",
    "where": "system prompt, line 2"}
"""The busy range's top break (``cache/savings/top_break.py``'s shape)."""
BREAKS_MORE = [
    {"field": "tools", "kind": "tool_set_changed", "cause": "the tool list changed (added ['lookup_order_with_a_long_name'], removed [])",
     "excerpt": "", "token_offset": 1290, "tokens_lost": 6120, "count": 4,
     "fix": "", "fix_note": "send the same tools on every turn of a session"},
    {"field": "messages", "kind": "history_edit", "cause": "an earlier turn was edited or removed",
     "excerpt": "Here is the order summary for #####, shipped to an address in ⟨date⟩…",
     "token_offset": 2210, "tokens_lost": 880, "count": 1, "fix": "", "fix_note": "keep them as sent"},
]
ROUTE = ("requests", "errors", "cached_share", "saved_usd", "ttft_p50_ms", "ttft_p95_ms",
         "tpot_p50_ms", "queue_ms_p50", "prefill_ms_p50", "decode_ms_p50")
COMPARED = ("cached_share", "input_usd_per_request", "ttft_p50_ms", "ttft_p95_ms")


def _num_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


def contract_errors(p: dict[str, Any]) -> list[str]:
    """Every way ``p`` departs from the contract's names and shapes (empty = conforms)."""
    errs: list[str] = []

    def nums(where: str, obj: Any, names: tuple[str, ...]) -> None:
        if not isinstance(obj, dict):
            errs.append(f"{where}: not an object")
            return
        errs.extend(f"{where}.{n}: {obj.get(n, '<missing>')!r} is not a number or null"
                    for n in names if n not in obj or not _num_or_null(obj[n]))

    if p.get("range") not in RANGE_SECONDS:
        errs.append(f"range: {p.get('range')!r}")
    nums("", p, ("from_ts", "to_ts", "bucket_s"))
    nums("totals", p.get("totals"), TOTALS)
    nums("totals.cf_source", (p.get("totals") or {}).get("cf_source"),
         ("measured", "modelled", "holdout", "none"))
    for i, t in enumerate(p.get("by_technique", [])):
        nums(f"by_technique.{i}", t, TECHNIQUE)
    h = p.get("holdout") or {}
    if not isinstance(h.get("enabled"), bool) or not isinstance(h.get("verdict"), str):
        errs.append("holdout: enabled (bool) / verdict (str)")
    for i, b in enumerate(h.get("buckets", [])):
        nums(f"holdout.buckets.{i}", b, ("n_rewritten", "n_holdout"))
        for c in COMPARED:
            nums(f"holdout.buckets.{i}.{c}", b.get(c), ("rewritten", "holdout", "diff"))
    s = p.get("series") or {}
    n = len(s.get("ts", []))
    flat = {"ts": s.get("ts"), "requests": s.get("requests"), "cached_share": s.get("cached_share"),
            "saved_usd": s.get("saved_usd")}
    for group, names in (("tokens", ("cache_read", "cache_write", "uncached", "pruned")),
                         ("ttft_ms", ("p50", "p95", "p99")), ("tpot_ms", ("p50", "p95", "p99"))):
        for name in names:
            flat[f"{group}.{name}"] = (s.get(group) or {}).get(name)
    for name, arr in flat.items():
        if not isinstance(arr, list) or len(arr) != n or not all(map(_num_or_null, arr)):
            errs.append(f"series.{name}: not a list of {n} numbers / nulls")
    for i, r in enumerate(p.get("slo", [])):
        nums(f"slo.{i}", r, SLO)
    for kind in ("prompt", "output"):
        hist = (p.get("lengths") or {}).get(kind) or {}
        if len(hist.get("edges", [])) != len(hist.get("counts", [None])):
            errs.append(f"lengths.{kind}: edges and counts differ in length")
    for i, b in enumerate(p.get("breaks", [])):
        nums(f"breaks.{i}", b, BREAK)
    for i, r in enumerate(p.get("routes", [])):
        nums(f"routes.{i}", r, ROUTE)
    return errs


def fixture_app(payloads: dict[str, dict[str, Any]], guard: Guard | None = None) -> FastAPI:
    """An app serving the dashboard (:func:`prefixgate.proxy.observe.dashboard.install`, behind ``guard``) and a
    stand-in ``GET /api/savings?range=`` answering ``payloads[range]`` (behind the same guard;
    a range not in ``payloads``: 400). ``app.state.served``: (range, Authorization header) per answer given."""
    app = FastAPI()
    g = guard or Guard.open()
    dashboard.install(app, g)
    app.state.served = []

    @app.get("/api/savings")
    async def savings(request: Request, range: str = Query("1h")) -> Response:  # noqa: A002
        try:
            await g.admit(request.headers, "openai", limit=False)
        except Unauthorized as e:
            return error_response(e, "openai")
        if range not in payloads:
            return JSONResponse({"error": {"message": f"unknown range {range!r}"}}, status_code=400)
        app.state.served.append((range, request.headers.get("authorization", "")))
        return JSONResponse(payloads[range])

    return app
