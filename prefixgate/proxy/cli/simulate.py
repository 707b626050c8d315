"""``prefixgate simulate TRACE``: replay an agent trace through rewrite strategies into a provider
cache model, offline, and print cached-input share, cost, cache writes and breaks by kind.

Example::

    prefixgate simulate ../shared/data/traces/tau_bench_airline_gpt4o.json \\
        --provider anthropic --volatile-clock --json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from prefixgate.cache.provider_models import PROVIDERS
from prefixgate.config.loader import PolicyError, load_policy
from prefixgate.proxy.sim.simulate import (
    KEY_STRATEGIES,
    STRATEGIES,
    TTL_STRATEGIES,
    SimConfig,
    Simulator,
)
from prefixgate.proxy.sim.think_time import parse as parse_think_time
from prefixgate.proxy.sim.traces import TraceError, load_trace


def _table(fig: dict[str, Any]) -> str:
    head = (f"{fig['runs']} runs, {fig['requests']} requests, provider {fig['provider']}, "
            f"model {fig['model']}, volatile clock {'on' if fig['volatile_clock'] else 'off'} "
            f"({fig['seconds']} s)")
    cols = f"{'strategy':<20} {'cached':>7} {'cost $':>9} {'no-cache $':>10} {'writes':>10}  breaks"
    lines = [head, cols, "-" * len(cols)]
    for name, s in fig["strategies"].items():
        breaks = ", ".join(f"{k}: {v}" for k, v in s["breaks"].items()) or "none"
        lines.append(f"{name:<20} {s['cached_share']:>7.1%} {s['cost_usd']:>9.4f} "
                     f"{s['cost_no_cache_usd']:>10.4f} {s['write_tokens']:>10}  {breaks}")
        if s.get("rewrite_errors"):
            lines.append(f"{'':<20} rewrite errors: {s['rewrite_errors']} "
                         f"({s.get('first_rewrite_error', '')})")
    return "\n".join(lines)


def simulate(
    trace: Path = typer.Argument(..., help="tau-bench .json trace or SWE-agent .traj"),  # noqa: B008
    provider: str = typer.Option("anthropic", help="anthropic | openai | radix"),
    strategy: str = typer.Option(
        "all", help="none | positional | prefixgate | all | ttl (ttl-5m, ttl-1h, ttl-auto) | "
        "key (key-per-conversation, key-none, key-one-for-all) | one of those"),
    think_time: str | None = typer.Option(
        None, help="gap before each request of a run: fixed:30s | lognormal:MU,SIGMA | "
        "mix:tool=SPEC;user=SPEC (default: uniform 10-30 s)"),
    volatile_clock: bool = typer.Option(
        False, "--volatile-clock", help="put each request's simulated wall-clock time into the "
        "system prompt's 'The current time is ...' line"),
    clock_resolution: int = typer.Option(
        1, min=1, help="seconds the volatile clock is floored to (60 = minute resolution)"),
    runs: int | None = typer.Option(None, help="replay only the first N runs"),
    model: str | None = typer.Option(None, help="model id (default per provider)"),
    tools: Path | None = typer.Option(None, help="tools JSON for tau-bench traces"),  # noqa: B008
    seed: int = typer.Option(0, help="seed of the request spacing"),
    concurrency: int = typer.Option(1, min=1, help="runs in flight at once"),
    policy: Path | None = typer.Option(  # noqa: B008
        None, "--policy", help="take the prefixgate strategy's rewrite settings from this policy"),
    as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
) -> None:
    """Estimate offline what each rewrite strategy would cache on TRACE, for a provider.

    Exits 2 on a bad provider / strategy or an unreadable trace."""
    if provider not in PROVIDERS:
        typer.echo(f"unknown provider {provider!r}; expected one of {', '.join(PROVIDERS)}",
                   err=True)
        raise typer.Exit(2)
    groups = {"all": STRATEGIES, "ttl": TTL_STRATEGIES, "key": KEY_STRATEGIES}
    if strategy not in groups and strategy not in STRATEGIES + TTL_STRATEGIES + KEY_STRATEGIES:
        typer.echo(f"unknown strategy {strategy!r}; expected all, ttl, key or one of "
                   f"{', '.join(STRATEGIES + TTL_STRATEGIES + KEY_STRATEGIES)}", err=True)
        raise typer.Exit(2)
    try:
        think = parse_think_time(think_time) if think_time else None
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    settings = None
    if policy is not None:
        try:
            settings = load_policy(policy).rewrite
        except PolicyError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
    try:
        loaded = load_trace(trace, tools, runs)
    except (TraceError, OSError, ValueError) as e:
        typer.echo(f"cannot read trace: {e}", err=True)
        raise typer.Exit(2)
    cfg = SimConfig(provider=provider, model=model or "",
                    strategies=groups.get(strategy, (strategy,)),
                    volatile_clock=volatile_clock, seed=seed, concurrency=concurrency,
                    clock_resolution_s=clock_resolution, think_time=think)
    figures = Simulator(cfg, settings=settings).run(loaded)
    typer.echo(json.dumps(figures, indent=2) if as_json else _table(figures))


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command."""
    app.command("simulate")(simulate)
