"""``prefixgate report [--ledger PATH | --policy FILE] [--since MINUTES] [--breaks] [--json]``.

Prints one line per (route, backend) from the ledger: requests, errors, prompt tokens, cached
share, TTFT p50 / p95, TPOT p50, tokens pruned, the counterfactual cached share (what the
client's original bodies would have cached) where it was estimated, and the prompt cost in USD
as sent and as the client sent it (priced models only). ``--breaks`` lists the
cache-break records (:func:`cache.breaks.format_breaks`).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cache.ledger import Ledger
from config.loader import PolicyError, load_policy
from config.schema import LedgerSettings
from proxy.stats import fmt, summarize


def route_summaries(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(route, backend): summarize(rows)}`` plus ``cf_cached_share`` and, over requests
    priced both ways, ``input_usd`` / ``cf_input_usd`` (prompt USD as sent / as the client sent
    it) per group."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["route"] or "-", r["backend"] or "-")].append(r)
    out = {}
    for key, rs in groups.items():
        s = summarize(rs)
        cf = [r for r in rs if r.get("cf_cached_tokens") is not None and r.get("prompt_tokens")]
        s["cf_cached_share"] = (sum(r["cf_cached_tokens"] for r in cf)
                                / sum(r["prompt_tokens"] for r in cf)) if cf else None
        priced = [r for r in rs if r.get("input_usd") is not None
                  and r.get("cf_input_usd") is not None]
        s["input_usd"] = sum(r["input_usd"] for r in priced) if priced else None
        s["cf_input_usd"] = sum(r["cf_input_usd"] for r in priced) if priced else None
        out[key] = s
    return out


def _break_records(dicts: list[dict[str, Any]]) -> list[Any]:
    from cache.breaks import BreakRecord

    recs = []
    for d in dicts:
        d = dict(d)
        d["volatile_kinds"] = tuple(d.get("volatile_kinds") or ())
        recs.append(BreakRecord(**d))
    return recs


def report(
    ledger: Path | None = typer.Option(None, "--ledger", help="ledger SQLite file"),
    policy: Path | None = typer.Option(None, "--policy", help="take the ledger path from here"),
    since: float = typer.Option(0.0, "--since", help="only the last N minutes (0 = all)"),
    breaks: bool = typer.Option(False, "--breaks", help="list cache-break records"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Summarize the ledger per route."""
    if ledger is None:
        try:
            path = load_policy(policy).ledger.path if policy else LedgerSettings().path
        except PolicyError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
    else:
        path = str(ledger)
    if not Path(path).expanduser().exists():
        typer.echo(f"no ledger at {path} yet (send requests through the proxy first)", err=True)
        raise typer.Exit(1)
    db = Ledger(path)
    since_ts = time.time() - since * 60 if since else 0.0
    summaries = route_summaries(db.rows(since_ts))
    if as_json:
        typer.echo(json.dumps({f"{r}|{b}": s for (r, b), s in summaries.items()}, indent=2))
    else:
        t = Table(title=f"prefixgate ledger: {path}")
        for col in ("route", "backend", "requests", "errors", "prompt tok", "cached",
                    "TTFT p50 ms", "TTFT p95 ms", "TPOT p50 ms", "pruned", "cached if unrewritten",
                    "input $", "input $ if unrewritten"):
            t.add_column(col, justify="left" if col in ("route", "backend") else "right")
        for (route, backend), s in sorted(summaries.items()):
            t.add_row(route, backend, fmt(s["requests"]), fmt(s["errors"]),
                      fmt(s["prompt_tokens"]), fmt(s["cached_share"], "share"),
                      fmt(s["ttft_p50_ms"], "ms"), fmt(s["ttft_p95_ms"], "ms"),
                      fmt(s["tpot_p50_ms"], "ms"), fmt(s["tokens_pruned"]),
                      fmt(s["cf_cached_share"], "share"), fmt(s["input_usd"], "usd"),
                      fmt(s["cf_input_usd"], "usd"))
        Console().print(t)
    if breaks:
        from cache.breaks import format_breaks

        typer.echo(format_breaks(_break_records(db.breaks(since_ts))))
    db.close()


def register(app: typer.Typer) -> None:
    """Add ``report``."""
    app.command("report")(report)
