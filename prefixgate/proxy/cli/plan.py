"""``prefixgate plan --route NAME --ttft-slo-ms MS --tpot-slo-ms MS [--ledger PATH | --policy FILE]
[--since MINUTES] [--rate R] [--prefill-tps T] [--decode-step-ms MS] [--max-instances N]
[--transfer-ms-per-token X] [--split-overhead-ms O] [--json]``.

Reads one route's measured load from the ledger (arrival rate, uncached prompt and output
lengths, prefill rate from ``prefill_ms``, decode step from ``tpot_ms``) and recommends
colocating prefill and decode or splitting them, with instance counts
(:mod:`prefixgate.proxy.routing.pd.plan`: a DistServe-style queueing model; means only). ``--rate``,
``--prefill-tps`` and ``--decode-step-ms`` override the measured figures (what-if: "at 3x the
traffic"). Exit 1 when the ledger has too few usable rows for the route; 2 for bad options.
``--json``: ``{"route", "recommendation", "chosen", "alternative", "load"}``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import typer

from prefixgate.proxy.cli.report import _ledger_path, _open_ledger
from prefixgate.proxy.routing.pd.plan import (
    SPLIT_OVERHEAD_S,
    TRANSFER_S_PER_TOKEN,
    Option,
    load_from_rows,
    plan,
)


def _line(o: Option | None) -> str:
    if o is None:
        return "-"
    what = (f"{o.prefill} prefill + {o.decode} decode" if o.prefill
            else f"{o.decode} colocated")
    d = o.to_dict()
    ttft = "unbounded" if d["ttft_ms"] is None else f"{d['ttft_ms']:,.0f} ms"
    tpot = "unbounded" if d["tpot_ms"] is None else f"{d['tpot_ms']:,.1f} ms"
    return f"{what}: TTFT {ttft}, TPOT {tpot}" + ("" if o.meets_slo else " (misses the SLO)")


def plan_cmd(
    route: str = typer.Option(..., "--route", help="the route whose load to plan for"),
    ttft_slo_ms: float = typer.Option(..., "--ttft-slo-ms", help="mean TTFT target (ms)"),
    tpot_slo_ms: float = typer.Option(..., "--tpot-slo-ms", help="mean TPOT target (ms)"),
    ledger: str | None = typer.Option(None, "--ledger", metavar="<path>|<url>",
                                      help="ledger SQLite file or postgresql:// URL"),
    policy: Path | None = typer.Option(None, "--policy", help="take the ledger path from here"),
    since: float = typer.Option(0.0, "--since", help="only the last N minutes (0 = all)"),
    rate: float | None = typer.Option(None, "--rate", help="requests/s instead of the measured"),
    prefill_tps: float | None = typer.Option(None, "--prefill-tps",
                                             help="prefill tokens/s instead of the measured"),
    decode_step_ms: float | None = typer.Option(None, "--decode-step-ms",
                                                help="decode step (ms) instead of TPOT p50"),
    max_instances: int = typer.Option(16, "--max-instances", help="largest deployment tried"),
    transfer_ms_per_token: float = typer.Option(TRANSFER_S_PER_TOKEN * 1000.0,
                                                "--transfer-ms-per-token",
                                                help="KV handoff cost per uncached token (ms)"),
    split_overhead_ms: float = typer.Option(SPLIT_OVERHEAD_S * 1000.0, "--split-overhead-ms",
                                            help="the split's orchestration per request (ms)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON object"),
) -> None:
    """Recommend colocated or split prefill/decode for a route, with instance counts."""
    if min(ttft_slo_ms, tpot_slo_ms) <= 0 or max_instances < 1 or (rate is not None
                                                                   and rate <= 0):
        typer.echo("SLOs and --rate must be > 0, --max-instances >= 1", err=True)
        raise typer.Exit(2)
    where, _, _ = _ledger_path(ledger, policy)
    db = _open_ledger(where)
    since_ts = time.time() - since * 60 if since else 0.0
    rows = [r for r in db.rows(since_ts) if r.get("route") == route]
    try:
        load = load_from_rows(rows, prefill_tps,
                              None if decode_step_ms is None else decode_step_ms / 1000.0)
    except ValueError as e:
        typer.echo(f"route {route!r}: {e}", err=True)
        raise typer.Exit(1) from None
    if rate is not None:
        load = replace(load, lam=rate)
    got = plan(load, ttft_slo_ms / 1000.0, tpot_slo_ms / 1000.0, max_instances,
               transfer_ms_per_token / 1000.0, split_overhead_ms / 1000.0)
    if as_json:
        typer.echo(json.dumps({"route": route, **got.to_dict()}, indent=2))
        return
    ld = got.load
    typer.echo(f"route {route}: {ld['requests']} requests, {ld['rate_per_s']}/s, "
               f"{ld['uncached_tokens_mean']} uncached prompt tokens and "
               f"{ld['output_tokens_mean']} output tokens on average; prefill "
               f"{ld['prefill_tokens_per_s']:,} tokens/s, decode step {ld['decode_step_ms']} ms")
    typer.echo(f"recommendation: {got.recommendation} — {_line(got.chosen)}")
    typer.echo(f"  the other way: {_line(got.alternative)}")


def register(app: typer.Typer) -> None:
    """Add ``prefixgate plan``."""
    app.command("plan")(plan_cmd)
