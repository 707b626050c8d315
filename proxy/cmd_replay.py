"""Placeholder: command module being built (see proxy/cli.py)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the CLI."""
