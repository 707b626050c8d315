"""``prefixgate report [--ledger PATH | --policy FILE] [--since MINUTES] [--by route|model|tenant|day]
[--errors] [--breaks] [--json | --csv]``.

Opens with the "saved" line — USD saved and its share of what the client's own bodies would
have cost, tokens saved (cache reuse gained + pruned - added), TTFT p50 rewritten minus holdout
(when the policy's holdout sent some sessions unrewritten) — the saved tokens by technique (the
``unattributed`` remainder named), the routes that stood back, then one row per group
(:mod:`prefixgate.cache.report`). The layout follows the terminal width (``COLUMNS``): below
:data:`WIDE` columns a compact table (requests, errors, cached share, saved $ / %, TTFT p50,
TPOT p50) that fits 80 columns; from :data:`WIDE` on prompt tokens, input $ and TTFT p95 are
added, from :data:`FULL` on the counterfactual cached share and pruned tokens. A TTFT marked
``*`` includes TTFTs the backend reported for non-streamed answers (the others were timed by the
proxy on streams).

``--json``: ``{"ledger", "by", "saved": {...}, "groups": [{<by>: key, figures...}],
"by_technique": [{"technique", "tokens_reusable", "tokens_removed", "tokens_added",
"saved_tokens", "usd"}], "stood_back": [{"route", "requests", "passes", "reason", "last_ts"}],
"errors": [...]}`` with named fields (:mod:`prefixgate.cache.attribution`: the techniques,
``unattributed`` included, sum to the saved line; :mod:`prefixgate.cache.stand_back`: routes
whose token-adding passes switched themselves off, also printed under the saved line);
``--csv``: one header line and one line per group.
``--errors`` lists failed requests by status and error; ``--breaks`` the cache-break records
(:func:`prefixgate.cache.breaks.format_breaks`).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from prefixgate.cache.attribution import by_technique
from prefixgate.cache.ledger import Ledger
from prefixgate.cache.report import (
    BY,
    error_figures,
    group_figures,
    saved_figures,
    stand_back_figures,
)
from prefixgate.config.loader import PolicyError, load_policy
from prefixgate.config.schema import LedgerSettings
from prefixgate.proxy.cli.format import fmt

WIDE = 110
"""Terminal columns from which prompt tokens, input $ and TTFT p95 are added."""
FULL = 140
"""Terminal columns from which the counterfactual cached share and pruned tokens are added."""
CSV_FIELDS = ("requests", "errors", "prompt_tokens", "cached_tokens", "cached_share",
              "cf_cached_share", "input_usd", "cf_input_usd", "saved_usd", "saved_pct",
              "saved_tokens", "tokens_pruned", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms",
              "ttft_reported", "no_usage", "holdout")


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.4f}" if abs(v) < 100 else f"${v:,.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def saved_line(s: dict[str, Any], width: int) -> str:
    """The opening "saved" line(s), wrapped to ``width``."""
    if s["saved_usd"] is None:
        money = "saved $- (no priced request)"
    else:
        money = f"saved {_usd(s['saved_usd'])} ({_pct(s['saved_pct'])} of " \
                f"{_usd(s['cf_input_usd'])})"
    tokens = f"{s['saved_tokens']:,} tokens"
    if s["ttft_p50_diff_ms"] is None:
        ttft = f"TTFT p50 {_ms(s['ttft_p50_ms'])} ms (no holdout to compare)"
    else:
        d = s["ttft_p50_diff_ms"]
        ttft = (f"TTFT p50 {'-' if d < 0 else '+'}{_ms(abs(d))} ms vs holdout "
                f"({s['holdout_verdict']}, n={s['n_rewritten']}/{s['n_holdout']})")
    src = s.get("cf_source") or {}
    basis = "counterfactual: " + ", ".join(f"{n:,} {k}" for k, n in src.items() if n) \
        if any(src.values()) else ""
    text = f"{money} · {tokens} · {ttft}" + (f" · {basis}" if basis else "")
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


def technique_line(techs: list[dict[str, Any]], saved_tokens: int, width: int) -> str:
    """The saved tokens split by technique, the named remainder included (they add up to the
    saved line's tokens), wrapped to ``width``; "" without a technique."""
    if not techs:
        return ""
    parts = " · ".join(f"{t['technique']} {t['saved_tokens']:,}" for t in techs)
    text = f"saved tokens by technique: {parts} (sum {saved_tokens:,})"
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


def stand_back_lines(routes: list[dict[str, Any]], width: int) -> list[str]:
    """One wrapped line per route whose passes stood back (:func:`stand_back_figures`)."""
    out = []
    for e in routes:
        text = (f"stood back on route {e['route']}: {', '.join(e['passes'])} off for "
                f"{e['requests']:,} requests · {e['reason']}")
        out.append("\n".join(textwrap.wrap(text, width, subsequent_indent="  ")))
    return out


def _table(groups: list[dict[str, Any]], by: str, width: int) -> Table:
    wide, full = width >= WIDE, width >= FULL
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False)
    t.add_column(by, overflow="fold", max_width=28 if wide else 20)
    cols: list[tuple[str, Any]] = [
        ("req", lambda g: fmt(g["requests"])), ("err", lambda g: fmt(g["errors"])),
        ("cached", lambda g: _pct(g["cached_share"]))]
    if full:
        cols.append(("cf cached", lambda g: _pct(g["cf_cached_share"])))
    if wide:
        cols += [("prompt tok", lambda g: fmt(g["prompt_tokens"])),
                 ("input $", lambda g: _usd(g["input_usd"]))]
    if full:
        cols.append(("pruned", lambda g: fmt(g["tokens_pruned"])))
    cols += [("saved $", lambda g: _usd(g["saved_usd"])),
             ("saved", lambda g: _pct(g["saved_pct"])),
             ("TTFT50", lambda g: _ms(g["ttft_p50_ms"]) + ("*" if g["ttft_reported"] else ""))]
    if wide:
        cols.append(("TTFT95", lambda g: _ms(g["ttft_p95_ms"])))
    cols.append(("TPOT50", lambda g: _ms(g["tpot_p50_ms"])))
    for name, _ in cols:
        t.add_column(name, justify="right", no_wrap=True)
    for g in groups:
        t.add_row(str(g[by]), *(f(g) for _, f in cols))
    return t


def _errors_table(errors: list[dict[str, Any]]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False,
              title="errors", title_justify="left")
    for name in ("count", "status", "http", "error", "last (UTC)"):
        t.add_column(name, justify="right" if name in ("count", "http") else "left",
                     overflow="fold")
    for e in errors:
        t.add_row(fmt(e["count"]), e["status"], str(e["http_status"]), e["error"] or "-",
                  time.strftime("%m-%d %H:%M", time.gmtime(e["last_ts"])))
    return t


def _csv(groups: list[dict[str, Any]], by: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow((by, *CSV_FIELDS))
    for g in groups:
        w.writerow((g[by], *("" if g[f] is None else g[f] for f in CSV_FIELDS)))
    return buf.getvalue()


def _ledger_path(ledger: Path | None, policy: Path | None) -> tuple[str, int]:
    if ledger is not None:
        return str(ledger), 0
    try:
        pol = load_policy(policy) if policy else None
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    return (pol.ledger.path if pol else LedgerSettings().path), (pol.holdout.seed if pol else 0)


def _break_records(dicts: list[dict[str, Any]]) -> list[Any]:
    from prefixgate.cache.breaks import BreakRecord

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
    by: str = typer.Option("route", "--by", help="group by route | model | tenant | day"),
    errors: bool = typer.Option(False, "--errors", help="list failed requests by error"),
    breaks: bool = typer.Option(False, "--breaks", help="list cache-break records"),
    as_json: bool = typer.Option(False, "--json", help="print JSON objects instead"),
    as_csv: bool = typer.Option(False, "--csv", help="print CSV instead"),
) -> None:
    """Summarize the ledger: what was saved, per route / model / tenant / day."""
    if by not in BY:
        typer.echo(f"--by must be one of {', '.join(BY)}", err=True)
        raise typer.Exit(2)
    path, seed = _ledger_path(ledger, policy)
    if not Path(path).expanduser().exists():
        typer.echo(f"no ledger at {path} yet (send requests through the proxy first)", err=True)
        raise typer.Exit(1)
    db = Ledger(path)
    since_ts = time.time() - since * 60 if since else 0.0
    rows = db.rows(since_ts)
    groups = group_figures(rows, by)
    saved = saved_figures(rows, seed)
    stood = stand_back_figures(rows)
    errs = error_figures(rows) if errors else []
    if as_json:
        doc: dict[str, Any] = {"ledger": path, "by": by, "saved": saved, "groups": groups,
                               "by_technique": [t.to_dict() for t in by_technique(rows)],
                               "stood_back": stood}
        if errors:
            doc["errors"] = errs
        typer.echo(json.dumps(doc, indent=2))
    elif as_csv:
        typer.echo(_csv(groups, by), nl=False)
    else:
        width = shutil.get_terminal_size((80, 24)).columns
        console = Console(width=width, highlight=False, soft_wrap=False)
        console.print(saved_line(saved, width))
        techs = [t.to_dict() for t in by_technique(rows)]
        if techs:
            console.print(technique_line(techs, saved["saved_tokens"], width))
        for line in stand_back_lines(stood, width):
            console.print(line)
        console.print(_table(groups, by, width))
        if any(g["ttft_reported"] for g in groups):
            console.print("* includes TTFT reported by the backend (non-streamed answers)")
        if errors:
            console.print(_errors_table(errs))
    if breaks:
        from prefixgate.cache.breaks import format_breaks

        typer.echo(format_breaks(_break_records(db.breaks(since_ts))))
    db.close()


def register(app: typer.Typer) -> None:
    """Add ``report``."""
    app.command("report")(report)
