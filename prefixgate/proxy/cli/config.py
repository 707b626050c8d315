"""``prefixgate config check FILE``: validate a policy file, print each error with its YAML path.
``prefixgate config reference``: every key as Markdown. ``prefixgate config show-default``: the
shipped policy's YAML, comments included, to start one's own (``> my_policy.yaml``; issue 22,
item 6: the README never said where to get a policy file)."""

from __future__ import annotations

from pathlib import Path

import typer

from prefixgate.config.diagnose import diagnose
from prefixgate.config.loader import PolicyError, load_policy


def check(file: Path = typer.Argument(..., help="policy YAML file")) -> None:
    """Check a policy file: every problem in one run, then warnings.

    Prints "FILE: YAML.PATH: MESSAGE" per problem (exit 1).

    Prints "FILE: warning: YAML.PATH: MESSAGE" per warning (an unset ${ENV} key), else "FILE: ok"."""
    problems, warnings = diagnose(file)
    for path, msg in problems:
        typer.echo(f"{file}: {path or '<root>'}: {msg}", err=True)
    for path, msg in warnings:
        typer.echo(f"{file}: warning: {path}: {msg}", err=True)
    if problems:
        raise typer.Exit(1)
    try:
        policy = load_policy(file)
    except PolicyError as e:  # a check diagnose() does not make: still every problem
        for path, msg in e.problems:
            typer.echo(f"{file}: {path or '<root>'}: {msg}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{file}: ok ({len(policy.backends)} backends, {len(policy.routes)} routes)")


def reference() -> None:
    """Print the policy reference (every key, type, default, example) as Markdown."""
    from prefixgate.config.reference import policy_reference

    typer.echo(policy_reference(), nl=False)


def show_default() -> None:
    """Print the shipped default policy, comments included.

    Start your own with `prefixgate config show-default > my_policy.yaml`."""
    from prefixgate.config.loader import default_policy_text

    typer.echo(default_policy_text(), nl=False)


def register(app: typer.Typer) -> None:
    """Add the ``config`` command group."""
    group = typer.Typer(help="Check policy files, print the reference or the shipped policy.",
                        no_args_is_help=True)
    group.command("check")(check)
    group.command("reference")(reference)
    group.command("show-default")(show_default)
    app.add_typer(group, name="config")
