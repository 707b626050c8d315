"""The ``prefixgate`` command line (typer).

Each command lives in its own module with a ``register(app)`` function, so this file only
assembles them: ``serve``, ``engine``, ``config check``, ``report``, ``replay``, ``simulate``,
``keys add / list / remove``.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperOption

app = typer.Typer(help="prefixgate: prefix-cache-aware reverse proxy for agents.",
                  no_args_is_help=True, add_completion=False)

COMMAND_MODULES = (
    "proxy.cmd_serve",     # prefixgate serve / engine
    "proxy.cmd_config",    # prefixgate config check FILE
    "proxy.cmd_report",    # prefixgate report [--breaks]
    "proxy.cmd_replay",    # prefixgate replay TRACE
    "proxy.cmd_simulate",  # prefixgate simulate TRACE
    "proxy.cmd_keys",      # prefixgate keys add / list / remove
)

_display_type_rich = TyperOption.display_type_rich


def _flag_aware_type(self: TyperOption, ctx: Any) -> str | None:
    """Help shows a flag as a flag (``--json``), not ``--json <bool>``: typer 0.29 labels every
    option with its type, boolean flags included, though a flag takes no value."""
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


TyperOption.display_type_rich = _flag_aware_type  # type: ignore[method-assign,assignment]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


if __name__ == "__main__":
    app()
