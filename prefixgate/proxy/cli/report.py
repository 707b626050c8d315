"""``prefixgate report [--ledger PATH | --policy FILE] [--since MINUTES] [--by route|model|tenant|day]
[--errors] [--breaks] [--json | --csv]``.

Opens with the "saved" line — USD saved and its share of what the client's own bodies would have cost,
tokens saved (cache reuse gained + pruned - added), prefill seconds saved where the backend reports
its prefill time (our engine, llama.cpp; :mod:`prefixgate.cache.savings.time_saved`: the route's
measured prefill rate x the tokens rewriting made reusable, with what the prefix cache saved in all,
and the time priced at the backend's ``usd_per_hour`` when ``--policy`` sets one), TTFT p50 rewritten
minus holdout (when the policy's holdout sent some sessions unrewritten) — the saved tokens by
technique (the ``unattributed`` remainder named), the routes that stood back, then one row per group
(:mod:`prefixgate.cache.savings.report`). The layout follows the terminal width (``COLUMNS``): below
:data:`WIDE` columns a compact table (requests, errors, cached share, saved $ / %, TTFT p50, TPOT p50)
that fits 80 columns; from :data:`WIDE` on prompt tokens, input $ and TTFT p95 are added, from
:data:`FULL` on the counterfactual cached share, pruned tokens and prefill seconds saved. A TTFT
marked ``*`` includes TTFTs the backend reported for non-streamed answers (the others were timed by
the proxy on streams).

``--json``: ``{"ledger", "by", "saved": {...}, "groups": [{<by>: key, figures...}],
"by_technique": [{"technique", "tokens_reusable", "tokens_removed", "tokens_added",
"saved_tokens", "usd"}], "stood_back": [{"route", "requests", "passes", "reason", "last_ts"}],
"pd": {"split", "colocate", "split_share", "reasons"} | null, "top_break": {...} | null,
"errors": [...]}`` with named
fields (``pd``: P/D backends' split decisions, :mod:`prefixgate.cache.savings.pd_decisions`, also
printed as a "P/D:" line; :mod:`prefixgate.cache.ledger.attribution`: the techniques,
``unattributed`` included, sum to the saved line; :mod:`prefixgate.cache.savings.stand_back`: routes
whose token-adding passes switched themselves off, also printed under the saved line);
``--csv``: one header line and one line per group, every cell through :func:`csv_cell` (no cell
can start a spreadsheet formula, issue 20 class 13).
``--errors`` lists failed requests by status and error; ``--breaks`` the cache-break records
(:func:`prefixgate.cache.savings.breaks.format_breaks`). The meaning guard's trial sends are never
in these figures (issue 36): their cost has its own line, ``meaning-guard trials: N requests,
T tokens, $X`` (``--json``: ``trials``), and ``--guard`` adds each guarded move's verdict per
route and tenant and today's trial spend against the budget
(:mod:`prefixgate.proxy.cli.guard_report`; ``--json``: ``guard``).

Under the saved line, when cache breaks cost more than a threshold (5 % of the prompt tokens),
the top one: its cause, the masked line, where in the backend's tokens, its cost and the policy
line that fixes it (:mod:`prefixgate.cache.savings.top_break`, the same object as the dashboard's
first card and ``/api/savings``' ``top_break``; issue 37);
then each request a provider reported a cache-miss reason for, predicted cause vs reported, and
the agreement per cause (:mod:`prefixgate.cache.savings.miss_causes`; with ``--json``:
``provider_misses``).
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

from prefixgate.cache.ledger.attribution import by_technique
from prefixgate.cache.ledger.store import Ledger
from prefixgate.cache.savings.miss_causes import format_predicted_vs_reported, reported_summary
from prefixgate.cache.savings.pd_decisions import pd_summary
from prefixgate.cache.savings.report import (
    BY,
    error_figures,
    group_figures,
    saved_figures,
    stand_back_figures,
)
from prefixgate.cache.savings.top_break import explain_breaks, format_top_break, top_break
from prefixgate.cache.savings.trial_cost import trial_line, trial_rows, trial_spend
from prefixgate.config.loader import PolicyError, default_policy, load_policy
from prefixgate.config.schema import LedgerSettings
from prefixgate.proxy.cli.format import fmt
from prefixgate.proxy.cli.guard_report import guard_figures, guard_lines
from prefixgate.proxy.observe.savings_api import hourly_prices

WIDE = 110
"""Terminal columns from which prompt tokens, input $ and TTFT p95 are added."""
FULL = 140
"""Terminal columns from which the counterfactual cached share and pruned tokens are added."""
CSV_FIELDS = ("requests", "errors", "prompt_tokens", "cached_tokens", "cached_share",
              "cf_cached_share", "input_usd", "cf_input_usd", "saved_usd", "saved_pct",
              "saved_tokens", "tokens_pruned", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms",
              "ttft_reported", "no_usage", "holdout", "prefill_s_saved", "prefill_s_cached",
              "prefill_usd_saved", "ttft_s_saved_holdout")


FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n")
"""Leading characters that make a spreadsheet read a cell as a formula: OWASP, "CSV
Injection" (owasp.org/www-community/attacks/CSV_Injection, read at commit 0e5e8f0 of
OWASP/www-community, 2025-08: ``=``, ``+``, ``-``, ``@``, tab, carriage return, line feed)."""
NO_KEY = "-"
"""The report's own key for "none" (:func:`prefixgate.cache.savings.report.group_key`)."""


def csv_cell(value: Any) -> Any:
    """One CSV cell, neutralised as OWASP "CSV Injection" recommends, by where it came from:

    - a number (``int`` / ``float``, a figure the proxy computed from the ledger) is written as
      that number, a negative one too (``-0.0123`` stays a number: its text is digits, ``.``,
      ``-``, ``e``, never a formula); ``bool`` as ``0`` / ``1``; ``None`` as an empty cell;
    - text (a group key: route, model, tenant, day — model and tenant are client-chosen) that
      starts with one of :data:`FORMULA_TRIGGERS` gets a leading single quote, which spreadsheets
      read as "this is text" (``=HYPERLINK(...)`` -> ``'=HYPERLINK(...)``). The one exception is
      the report's own :data:`NO_KEY` ``-`` alone, which no spreadsheet evaluates (no operand).

    :func:`_csv` also quotes every text cell (``csv.QUOTE_NONNUMERIC``, quotes doubled), so a
    separator inside a name — ``,`` or the ``;`` of some locales — cannot start a new cell
    whose first character is a trigger (OWASP's note on separators and quotes)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    text = str(value)
    if text != NO_KEY and text.startswith(FORMULA_TRIGGERS):
        return "'" + text
    return text


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.4f}" if abs(v) < 100 else f"${v:,.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} s" if abs(v) >= 100 else f"{v:.1f} s"


def time_part(s: dict[str, Any]) -> str:
    """The saved line's time figures: prefill seconds saved by rewriting (and by the cache in
    all; priced by the hour when the policy says), the holdout's measured TTFT seconds; "" when
    the backend reports no prefill time and there is no holdout to compare."""
    parts = []
    if s.get("prefill_s_saved") is not None:
        priced = "" if s.get("prefill_usd_saved") is None else f", {_usd(s['prefill_usd_saved'])}"
        parts.append(f"prefill {_secs(s['prefill_s_saved'])} saved{priced} (the cache saved "
                     f"{_secs(s['prefill_s_cached'])} in all)")
    elif s.get("prefill_s_cached") is not None:
        parts.append(f"the cache saved {_secs(s['prefill_s_cached'])} of prefill")
    if s.get("ttft_s_saved_holdout") is not None:
        parts.append(f"TTFT {_secs(s['ttft_s_saved_holdout'])} saved vs holdout")
    return " · ".join(parts)


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
    time_saved = time_part(s)
    text = f"{money} · {tokens} · " + (f"{time_saved} · " if time_saved else "") + ttft + (
        f" · {basis}" if basis else "")
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


def pd_line(pd: dict[str, Any], width: int) -> str:
    """The P/D decisions line (:func:`prefixgate.cache.savings.pd_decisions.pd_summary`), wrapped."""
    reasons = ", ".join(f"{k} {n:,}" for k, n in pd["reasons"].items())
    text = (f"P/D: split {pd['split']:,} · colocated {pd['colocate']:,} "
            f"({_pct(pd['split_share'])} split; {reasons})")
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


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
        cols += [("pruned", lambda g: fmt(g["tokens_pruned"])),
                 ("prefill saved", lambda g: _secs(g["prefill_s_saved"]))]
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
    """The ``--csv`` text: a header and one line per group, cells by :func:`csv_cell`, text
    cells quoted."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    w.writerow((by, *CSV_FIELDS))
    for g in groups:
        w.writerow(tuple(csv_cell(v) for v in (g[by], *(g[f] for f in CSV_FIELDS))))
    return buf.getvalue()


def _ledger_path(ledger: str | Path | None, policy: Path | None
                 ) -> tuple[str, int, dict[str, float | None]]:
    """(ledger path or ``postgresql://`` URL, holdout seed, backend -> usd_per_hour) from
    ``--ledger`` / ``--policy`` (``--ledger`` names the file or the database; the policy, when
    given too, still prices the hours; a policy with ``ledger.url`` names its database)."""
    try:
        pol = load_policy(policy) if policy else None
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    hourly = hourly_prices(pol) if pol else {}
    if ledger is not None:
        return str(ledger), 0, hourly
    where = (pol.ledger.url or pol.ledger.path) if pol else LedgerSettings().path
    return where, (pol.holdout.seed if pol else 0), hourly


def _guard_policy(policy: Path | None) -> Any:
    """The policy whose budgets ``--guard`` compares against: ``--policy``, else the shipped
    default (its routes do not name the ledger's: the budgets then read "unknown")."""
    try:
        return load_policy(policy) if policy else default_policy()
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


def _open_ledger(where: str) -> Ledger:
    """The SQLite file at ``where``, or the shared PostgreSQL ledger when it is a
    ``postgresql://`` URL (every replica's rows, issue 26). Exits 1 with the reason when the file
    does not exist or the database cannot be reached."""
    if not where.startswith(("postgresql://", "postgres://")):
        if not Path(where).expanduser().exists():
            typer.echo(f"no ledger at {where} yet (send requests through the proxy first)",
                       err=True)
            raise typer.Exit(1)
        return Ledger(where)
    from prefixgate.cache.ledger.pg import PgLedger

    led = PgLedger(where, spool_path=":memory:")  # a reader: nothing is written or spooled
    try:
        led.query("SELECT 1")
    except Exception as e:
        led.close()
        typer.echo(f"cannot read the ledger at {led.path}: {type(e).__name__}", err=True)
        raise typer.Exit(1) from None
    return led


def _break_records(dicts: list[dict[str, Any]]) -> list[Any]:
    from prefixgate.cache.savings.breaks import BreakRecord

    known = set(BreakRecord.__dataclass_fields__)  # a record may carry more (``reported``)
    recs = []
    for d in dicts:
        d = {k: v for k, v in d.items() if k in known}
        d["volatile_kinds"] = tuple(d.get("volatile_kinds") or ())
        recs.append(BreakRecord(**d))
    return recs


def report(
    ledger: str | None = typer.Option(None, "--ledger", metavar="<path>|<url>",
                                       help="ledger SQLite file or postgresql:// URL"),
    policy: Path | None = typer.Option(None, "--policy", help="take the ledger path from here"),
    since: float = typer.Option(0.0, "--since", help="only the last N minutes (0 = all)"),
    by: str = typer.Option("route", "--by", help="group by route | model | tenant | day | replica"),
    errors: bool = typer.Option(False, "--errors", help="list failed requests by error"),
    breaks: bool = typer.Option(False, "--breaks", help="list cache-break records"),
    as_json: bool = typer.Option(False, "--json", help="print JSON objects instead"),
    as_csv: bool = typer.Option(False, "--csv", help="print CSV instead"),
    guard: bool = typer.Option(False, "--guard", help="the meaning guard: each guarded move's "
                               "verdict per route and tenant, trial spend vs budget"),
) -> None:
    """Summarize the ledger: what was saved, per route / model / tenant / day."""
    if by not in BY:
        typer.echo(f"--by must be one of {', '.join(BY)}", err=True)
        raise typer.Exit(2)
    path, seed, hourly = _ledger_path(ledger, policy)
    db = _open_ledger(path)
    path = db.path if db.kind == "postgresql" else path  # never a URL's password
    since_ts = time.time() - since * 60 if since else 0.0
    rows = db.rows(since_ts)
    groups = group_figures(rows, by, hourly)
    saved = saved_figures(rows, seed, hourly)
    stood = stand_back_figures(rows)
    errs = error_figures(rows) if errors else []
    break_dicts = db.breaks(since_ts)
    top = top_break(explain_breaks(break_dicts, rows), rows)
    trials = trial_spend(trial_rows(db, since_ts))  # never a saving: its own line (issue 36)
    trials.pop("by_route")
    guarded = guard_figures(db, _guard_policy(policy), since_ts) if guard else None
    if as_json:
        doc: dict[str, Any] = {"ledger": path, "by": by, "saved": saved, "groups": groups,
                               "by_technique": [t.to_dict() for t in by_technique(rows)],
                               "stood_back": stood, "pd": pd_summary(rows), "top_break": top}
        doc["trials"] = trials
        if guarded is not None:
            doc["guard"] = guarded
        if errors:
            doc["errors"] = errs
        if breaks:  # the providers' own reasons against prefixgate's predicted causes
            doc["provider_misses"] = reported_summary(rows)
        typer.echo(json.dumps(doc, indent=2))
    elif as_csv:
        typer.echo(_csv(groups, by), nl=False)
    else:
        width = shutil.get_terminal_size((80, 24)).columns
        console = Console(width=width, highlight=False, soft_wrap=False)
        console.print(saved_line(saved, width))
        if top is not None:  # the costliest cause, its masked line, its cost, its fix (issue 37)
            for line in format_top_break(top, width):
                console.print(line, markup=False)
        techs = [t.to_dict() for t in by_technique(rows)]
        if techs:
            console.print(technique_line(techs, saved["saved_tokens"], width))
        for line in stand_back_lines(stood, width):
            console.print(line)
        if (pd := pd_summary(rows)) is not None:
            console.print(pd_line(pd, width))
        if trials["requests"]:
            console.print(trial_line(trials), markup=False)
        for line in guard_lines(guarded) if guarded is not None else ():
            console.print(line, markup=False, overflow="fold")
        console.print(_table(groups, by, width))
        if any(g["ttft_reported"] for g in groups):
            console.print("* includes TTFT reported by the backend (non-streamed answers)")
        if errors:
            console.print(_errors_table(errs))
    if breaks:
        from prefixgate.cache.savings.breaks import format_breaks

        typer.echo(format_breaks(_break_records(break_dicts)))
        if not as_json:
            typer.echo(format_predicted_vs_reported(rows))
    db.close()


def register(app: typer.Typer) -> None:
    """Add ``report``."""
    app.command("report")(report)
