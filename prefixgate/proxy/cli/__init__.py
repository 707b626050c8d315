"""The ``prefixgate`` command line (typer).

Each command lives in its own module of this package with a ``register(app)`` function, so
this file only assembles them: ``serve``, ``engine``, ``config check / reference / show-default``,
``report``, ``plan``, ``replay``, ``simulate``, ``keys add / list / remove``, ``rewrite``, ``grafana``.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperOption

from prefixgate import __version__
from prefixgate.proxy.cli import (
    config,
    grafana,
    keys,
    plan,
    replay,
    report,
    rewrite,
    serve,
    simulate,
)

app = typer.Typer(help="prefixgate: prefix-cache-aware reverse proxy for agents.",
                  no_args_is_help=True, add_completion=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"prefixgate {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """prefixgate: prefix-cache-aware reverse proxy for agents."""

COMMAND_MODULES = (
    serve,  # prefixgate serve / engine
    config,  # prefixgate config check FILE
    report,  # prefixgate report [--breaks]
    plan,  # prefixgate plan --route R --ttft-slo-ms --tpot-slo-ms
    replay,  # prefixgate replay TRACE
    simulate,  # prefixgate simulate TRACE
    keys,  # prefixgate keys add / list / remove
    rewrite,  # prefixgate rewrite REQUEST.json
    grafana,  # prefixgate grafana > dashboard.json
)

_display_type_rich = TyperOption.display_type_rich


def _flag_aware_type(self: TyperOption, ctx: Any) -> str | None:
    """Help shows a flag as a flag (``--json``), not ``--json <bool>``: typer 0.29 labels every
    option with its type, boolean flags included, though a flag takes no value."""
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


TyperOption.display_type_rich = _flag_aware_type  # type: ignore[method-assign,assignment]

for _module in COMMAND_MODULES:
    _module.register(app)


if __name__ == "__main__":
    app()
