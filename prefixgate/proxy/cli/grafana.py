"""``prefixgate grafana``: print the fleet's Grafana dashboard (:mod:`prefixgate.proxy.observe.grafana`)."""

from __future__ import annotations

from pathlib import Path

import typer

from prefixgate.proxy.observe.grafana import render


def grafana(out: Path | None = typer.Option(None, "--out", help="write here instead of stdout")
            ) -> None:
    """Print the Grafana dashboard (JSON) for a fleet of prefixgate replicas."""
    if out is None:
        typer.echo(render(), nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    typer.echo(f"wrote {out}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``prefixgate grafana``."""
    app.command("grafana")(grafana)

