"""``prefixgate config check FILE``: validate a policy file, print each error with its YAML path."""

from __future__ import annotations

from pathlib import Path

import typer

from config.loader import PolicyError, load_policy


def check(file: Path = typer.Argument(..., help="policy YAML file")) -> None:
    """Print ``ok`` and exit 0, or print ``<yaml.path>: <message>`` per problem and exit 1."""
    try:
        policy = load_policy(file)
    except PolicyError as e:
        for path, msg in e.problems:
            typer.echo(f"{file}: {path or '<root>'}: {msg}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{file}: ok ({len(policy.backends)} backends, {len(policy.routes)} routes)")


def register(app: typer.Typer) -> None:
    """Add the ``config`` command group."""
    group = typer.Typer(help="Policy file commands.", no_args_is_help=True)
    group.command("check")(check)
    app.add_typer(group, name="config")
