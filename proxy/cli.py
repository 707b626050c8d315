"""The ``prefixgate`` command line (typer).

Each command lives in its own module with a ``register(app)`` function, so this file only
assembles them: ``serve``, ``engine``, ``config check``, ``report``, ``replay``, ``simulate``,
``keys add / list / remove``, ``rewrite``, ``grafana``.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="prefixgate: prefix-cache-aware reverse proxy for agents.",
                  no_args_is_help=True, add_completion=False)

COMMAND_MODULES = (
    "proxy.cmd_serve",     # prefixgate serve / engine
    "proxy.cmd_config",    # prefixgate config check FILE
    "proxy.cmd_report",    # prefixgate report [--breaks]
    "proxy.cmd_replay",    # prefixgate replay TRACE
    "proxy.cmd_simulate",  # prefixgate simulate TRACE
    "proxy.cmd_keys",      # prefixgate keys add / list / remove
    "proxy.cmd_rewrite",   # prefixgate rewrite REQUEST.json
    "proxy.grafana",       # prefixgate grafana > dashboard.json
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


if __name__ == "__main__":
    app()
